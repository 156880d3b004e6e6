//! The alloc's client status, computed from its task states with Nomad's rules: any task failed
//! → `failed`; else any task running → `running`; else any task pending → `pending`; else (all
//! dead) → `complete`.

use std::collections::BTreeMap;

use nomad_proto::alloc::task_state;
use nomad_proto::{ClientStatus, TaskState};

/// The client status and its description.
pub fn client_status(states: &BTreeMap<String, TaskState>) -> (ClientStatus, &'static str) {
    let (mut pending, mut running, mut dead, mut failed) = (false, false, false, false);
    for s in states.values() {
        match s.state.as_str() {
            task_state::RUNNING => running = true,
            task_state::DEAD if s.failed => failed = true,
            task_state::DEAD => dead = true,
            _ => pending = true,
        }
    }
    if failed {
        (ClientStatus::Failed, "Failed tasks")
    } else if running {
        (ClientStatus::Running, "Tasks are running")
    } else if pending {
        (ClientStatus::Pending, "No tasks have started")
    } else if dead {
        (ClientStatus::Complete, "All tasks have completed")
    } else {
        (ClientStatus::Pending, "No tasks have started")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn states(list: &[(&str, bool)]) -> BTreeMap<String, TaskState> {
        list.iter()
            .enumerate()
            .map(|(i, (s, failed))| (format!("t{i}"), TaskState { state: s.to_string(), failed: *failed, ..TaskState::default() }))
            .collect()
    }

    #[test]
    fn nomads_rules() {
        let cases: &[(&[(&str, bool)], ClientStatus)] = &[
            (&[("pending", false), ("pending", false)], ClientStatus::Pending),
            (&[("running", false), ("pending", false)], ClientStatus::Running),
            (&[("running", false), ("dead", false)], ClientStatus::Running),
            (&[("dead", false), ("dead", false)], ClientStatus::Complete),
            (&[("dead", false), ("pending", false)], ClientStatus::Pending),
            (&[("running", false), ("dead", true)], ClientStatus::Failed),
            (&[("dead", true), ("dead", false)], ClientStatus::Failed),
            (&[], ClientStatus::Pending),
        ];
        for (list, want) in cases {
            assert_eq!(client_status(&states(list)).0, *want, "{list:?}");
        }
        assert_eq!(client_status(&states(&[("dead", false)])).1, "All tasks have completed");
    }
}
