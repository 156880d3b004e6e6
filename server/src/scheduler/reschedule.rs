//! Reschedule policy math: when a failed alloc may be replaced, and how the
//! delay grows (`constant`, `exponential`, `fibonacci`, capped by `max_delay`).

use nomad_proto::alloc::{RescheduleEvent, RescheduleTracker, task_state};
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, ReschedulePolicy, Timestamp};

/// Reschedule events kept when rescheduling is unlimited.
const MAX_PAST_RESCHEDULE_EVENTS: usize = 5;

/// The reschedule policy of the alloc's own job version.
pub(crate) fn policy(a: &Allocation) -> Option<&ReschedulePolicy> {
    a.job.as_ref()?.lookup_task_group(&a.task_group)?.reschedule_policy.as_ref()
}

/// When the alloc failed: the latest task finish, else its last modification.
pub(crate) fn last_event_time(a: &Allocation) -> Timestamp {
    let latest = a.task_states.iter().flat_map(|m| m.values()).map(|s| s.finished_at).max().unwrap_or(Timestamp::ZERO);
    if latest.is_zero() { Timestamp(a.modify_time) } else { latest }
}

fn events(a: &Allocation) -> &[RescheduleEvent] {
    a.reschedule_tracker.as_ref().map(|t| t.events.as_slice()).unwrap_or_default()
}

/// The delay before the next reschedule, ns.
pub(crate) fn next_delay(a: &Allocation) -> i64 {
    let Some(p) = policy(a) else { return 0 };
    let events = events(a);
    let Some(last) = events.last() else { return p.delay };
    let mut delay = match p.delay_function.as_str() {
        "exponential" => last.delay.saturating_mul(2),
        "fibonacci" if events.len() >= 2 => {
            let (n1, n2) = (last.delay, events[events.len() - 2].delay);
            // A series that hit the ceiling and was reset starts over.
            if n2 == p.max_delay && n1 == p.delay { n1 } else { n1.saturating_add(n2) }
        }
        "fibonacci" => p.delay,
        _ => return p.delay,
    };
    if p.max_delay > 0 && delay > p.max_delay {
        delay = p.max_delay;
        // Long enough since the last reschedule: start again from the base delay.
        if last_event_time(a).unix_nanos() - last.reschedule_time > delay {
            delay = p.delay;
        }
    }
    delay
}

/// When a failed alloc may be rescheduled and whether the policy allows it
/// at all (Nomad's `NextRescheduleTime`). `None` for allocs that are not
/// failed, are already stopped or have no policy.
pub(crate) fn next_reschedule_time(a: &Allocation) -> Option<(Timestamp, bool)> {
    let fail = last_event_time(a);
    if a.desired_status == DesiredStatus::Stop || a.client_status != ClientStatus::Failed || fail.is_zero() {
        return None;
    }
    next_reschedule_time_from(a, fail)
}

/// Like [`next_reschedule_time`] counting from `fail` (disconnects).
pub(crate) fn next_reschedule_time_from(a: &Allocation, fail: Timestamp) -> Option<(Timestamp, bool)> {
    let p = policy(a)?;
    let delay = next_delay(a);
    let at = fail.add_nanos(delay);
    let events = events(a);
    let eligible = if p.attempts > 0 && !events.is_empty() {
        let attempted = events.iter().filter(|e| fail.unix_nanos() - e.reschedule_time < p.interval).count() as i64;
        attempted < p.attempts && delay < p.interval
    } else {
        p.unlimited || p.attempts > 0
    };
    Some((at, eligible))
}

/// The tracker of a replacement: the previous events still in the policy's
/// window (the last few when unlimited) plus this reschedule.
pub(crate) fn tracker_for_replacement(prev: &Allocation, now: Timestamp) -> RescheduleTracker {
    let p = policy(prev);
    let old = events(prev);
    let mut kept: Vec<RescheduleEvent> = match p {
        Some(p) if p.attempts > 0 => {
            old.iter().filter(|e| p.interval > 0 && now.unix_nanos() - e.reschedule_time <= p.interval).cloned().collect()
        }
        _ => old[old.len().saturating_sub(MAX_PAST_RESCHEDULE_EVENTS)..].to_vec(),
    };
    kept.push(RescheduleEvent {
        reschedule_time: now.unix_nanos(),
        prev_alloc_id: prev.id.clone(),
        prev_node_id: prev.node_id.clone(),
        delay: next_delay(prev),
    });
    RescheduleTracker { events: kept }
}

/// Every task finished successfully (a batch alloc that must not run again).
pub(crate) fn ran_successfully(a: &Allocation) -> bool {
    match &a.task_states {
        Some(states) if !states.is_empty() => states.values().all(|s| s.state == task_state::DEAD && !s.failed),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nomad_proto::{Job, TaskGroup};

    use super::*;

    const S: i64 = 1_000_000_000;

    fn alloc(policy: ReschedulePolicy, delays: &[i64]) -> Allocation {
        let job = Job {
            task_groups: vec![TaskGroup { name: "g".into(), reschedule_policy: Some(policy), ..TaskGroup::default() }],
            ..Job::default()
        };
        let events = delays
            .iter()
            .enumerate()
            .map(|(i, d)| RescheduleEvent { reschedule_time: (i as i64 + 1) * S, delay: *d, ..RescheduleEvent::default() })
            .collect();
        Allocation {
            task_group: "g".into(),
            job: Some(Arc::new(job)),
            client_status: ClientStatus::Failed,
            modify_time: 100 * S,
            reschedule_tracker: (!delays.is_empty()).then_some(RescheduleTracker { events }),
            ..Allocation::default()
        }
    }

    fn policy(function: &str, delay: i64, max: i64) -> ReschedulePolicy {
        ReschedulePolicy {
            delay: delay * S,
            max_delay: max * S,
            delay_function: function.into(),
            unlimited: true,
            ..ReschedulePolicy::default()
        }
    }

    #[test]
    fn constant_delay_never_grows() {
        assert_eq!(next_delay(&alloc(policy("constant", 5, 0), &[5 * S, 5 * S])), 5 * S);
    }

    #[test]
    fn exponential_doubles_up_to_the_cap() {
        let p = policy("exponential", 5, 30);
        assert_eq!(next_delay(&alloc(p.clone(), &[])), 5 * S);
        assert_eq!(next_delay(&alloc(p.clone(), &[5 * S])), 10 * S);
        assert_eq!(next_delay(&alloc(p.clone(), &[5 * S, 10 * S])), 20 * S);
        let mut capped = alloc(p, &[5 * S, 10 * S, 20 * S]);
        // The last reschedule was at 3 s and the alloc failed at 20 s: within the cap.
        capped.modify_time = 20 * S;
        assert_eq!(next_delay(&capped), 30 * S);
        // Failing long after the last reschedule resets to the base delay.
        capped.modify_time = 1000 * S;
        assert_eq!(next_delay(&capped), 5 * S);
    }

    #[test]
    fn fibonacci_adds_the_last_two() {
        let p = policy("fibonacci", 5, 100);
        assert_eq!(next_delay(&alloc(p.clone(), &[5 * S])), 5 * S);
        assert_eq!(next_delay(&alloc(p.clone(), &[5 * S, 5 * S])), 10 * S);
        assert_eq!(next_delay(&alloc(p.clone(), &[5 * S, 5 * S, 10 * S])), 15 * S);
        assert_eq!(next_delay(&alloc(p, &[100 * S, 5 * S])), 5 * S, "a reset series starts over");
    }

    #[test]
    fn attempts_are_counted_within_the_interval() {
        let p = ReschedulePolicy {
            attempts: 2,
            interval: 50 * S,
            delay: 5 * S,
            delay_function: "constant".into(),
            ..ReschedulePolicy::default()
        };
        let mut a = alloc(p.clone(), &[]);
        assert_eq!(next_reschedule_time(&a), Some((Timestamp(105 * S), true)));
        a = alloc(p.clone(), &[5 * S, 5 * S]);
        a.modify_time = 10 * S;
        assert_eq!(next_reschedule_time(&a).map(|x| x.1), Some(false), "two attempts in the window");
        a.modify_time = 100 * S;
        assert_eq!(next_reschedule_time(&a).map(|x| x.1), Some(true), "old attempts age out");
        a.client_status = ClientStatus::Running;
        assert_eq!(next_reschedule_time(&a), None);
    }

    #[test]
    fn tracker_keeps_recent_events_and_appends() {
        let p = ReschedulePolicy {
            attempts: 3,
            interval: 10 * S,
            delay: 5 * S,
            delay_function: "constant".into(),
            ..ReschedulePolicy::default()
        };
        let prev = alloc(p, &[S, S]);
        let t = tracker_for_replacement(&prev, Timestamp(11 * S));
        // The event at 1 s is 10 s old (kept: <= interval), the one at 2 s too; plus the new one.
        assert_eq!(t.events.len(), 3);
        assert_eq!(t.events[2].reschedule_time, 11 * S);
        let unlimited = alloc(policy("constant", 1, 0), &[S; 7]);
        assert_eq!(tracker_for_replacement(&unlimited, Timestamp(0)).events.len(), MAX_PAST_RESCHEDULE_EVENTS + 1);
    }
}
