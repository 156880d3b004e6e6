//! The orderings that found bugs, kept as named tests (each failed before
//! its fix; the commit message of the fix tells the story), and the last one,
//! which found a gap in the test model's idea of Nomad's rules.

use crate::run;
use crate::world::{Event, Kind, NODE, Pending, Scenario, Step};

use Step::*;

fn sc(count: i64, spare: bool, event: Event, pending: Pending, marked: bool) -> Scenario {
    Scenario { kind: Kind::Service, count, max_disconnect: true, spare, event, pending, marked }
}

fn check(sc: Scenario, steps: &[Step]) {
    if let Err(e) = run(sc, steps) {
        panic!("scenario {sc}\n  {e}");
    }
}

/// An alloc batch the syncer took before the heartbeat that moved the node
/// to `initializing` lands after it and covers only the failed alloc: the
/// node must not become ready while its other alloc is still `unknown`
/// (the scheduler would replace it on a ready node whose client runs it).
#[test]
fn a_partial_alloc_update_does_not_make_the_node_ready() {
    check(
        sc(2, true, Event::AllocFailed, Pending::Changed, true),
        &[SyncBegin, Heartbeat, SyncEnd, Heartbeat, Pull, UpdateAlloc, Register],
    );
    check(
        sc(2, false, Event::AllocFailed, Pending::Changed, true),
        &[SyncBegin, Heartbeat, SyncEnd, Heartbeat, Pull, UpdateAlloc, Register],
    );
}

/// The client is back before the scheduler marked its allocs `unknown` and
/// has nothing new to report: it must still get the node out of
/// `initializing` (it reports every alloc again when a heartbeat says so).
#[test]
fn a_client_back_before_its_allocs_were_marked_gets_ready() {
    check(
        sc(2, false, Event::None, Pending::Changed, false),
        &[Register, UpdateAlloc, Register, Heartbeat, Compute, Pull, UpdateAlloc, Apply],
    );
    check(sc(1, true, Event::None, Pending::Changed, false), &[Heartbeat, Heartbeat, Heartbeat, Pull, Heartbeat]);
}

/// A disconnect plan computed while the node was away is applied after it
/// came back: its `unknown` markers are refused, and so are the
/// replacements that went with them (committing those alone ran both
/// copies, and the next plan then stopped the healthy originals).
#[test]
fn a_stale_disconnect_plan_neither_marks_nor_replaces_a_returned_node() {
    check(sc(2, true, Event::None, Pending::Changed, false), &[Pull, Compute, UpdateAlloc, UpdateAlloc, Register, Heartbeat]);
    check(sc(2, true, Event::AllocFailed, Pending::Changed, false), &[Compute, Heartbeat, Register, UpdateAlloc, Heartbeat, Pull, Compute]);
    check(sc(2, true, Event::None, Pending::All, false), &[Register, Compute, Pull, Heartbeat, Register, Pull, Compute, UpdateAlloc]);
}

/// The node came back, missed its heartbeat while `initializing` (→ down)
/// before its alloc update landed, and heartbeats again: with allocs still
/// `unknown` it returns through `initializing`, not straight to ready.
#[test]
fn a_down_node_with_unknown_allocs_returns_through_initializing() {
    let steps =
        [UpdateAlloc, Heartbeat, Others, Pull, Expire, Apply, UpdateAlloc, Register, UpdateAlloc, Others, Register, Heartbeat, Schedule];
    check(sc(2, true, Event::JobUpdate, Pending::Changed, true), &steps);
    check(sc(1, true, Event::None, Pending::All, true), &[Heartbeat, Pull, Expire, Heartbeat, Schedule, UpdateAlloc]);
}

/// The node is back (its allocs running again, the reconnect not yet
/// settled) and disconnects again: its allocs keep the replacements they
/// have instead of getting a second one each.
#[test]
fn an_alloc_disconnecting_again_keeps_its_one_replacement() {
    check(sc(2, true, Event::JobUpdate, Pending::Changed, true), &[Heartbeat, Pull, UpdateAlloc, Heartbeat, Register, Expire, Compute]);
    check(sc(1, true, Event::None, Pending::All, true), &[Heartbeat, UpdateAlloc, Heartbeat, Expire, Schedule]);
}

/// Not a bug, Nomad's rule, kept as the ordering that taught the model it: a
/// system alloc fails while its node is away, the scheduler never marked it
/// `unknown`, and the failure lands after the returning node's evals ran.
/// Nomad creates no eval for it (system groups have no reschedule policy), so
/// it stays failed until the job's next evaluation, which places its
/// successor on the same node.
#[test]
fn a_failed_system_alloc_never_marked_unknown_waits_for_the_jobs_next_evaluation() {
    let sc = Scenario {
        kind: Kind::System,
        count: 1,
        max_disconnect: true,
        spare: true,
        event: Event::AllocFailed,
        pending: Pending::Changed,
        marked: false,
    };
    let w = run(sc, &[Heartbeat, Expire, Heartbeat, Schedule, UpdateAlloc]).unwrap_or_else(|e| panic!("scenario {sc}\n  {e}"));
    assert!(w.trace().contains("the job's next evaluation"), "the failure was followed before the next evaluation:\n{}", w.trace());
    let s = w.sim.state();
    let failed = s.alloc(&w.originals[0]).unwrap();
    assert_eq!((failed.desired_status, failed.client_status), (nomad_proto::DesiredStatus::Run, nomad_proto::ClientStatus::Failed));
    let next = s.allocs_by_job("default", "web").find(|a| a.previous_allocation == failed.id).expect("a successor");
    assert_eq!((next.node_id.as_str(), next.client_status), (NODE, nomad_proto::ClientStatus::Running));
}
