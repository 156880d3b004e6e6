//! Task lifecycle ordering within an alloc:
//!
//! ```text
//!  prestart (non-sidecar run to completion, sidecars keep running)
//!      │ every non-sidecar prestart task finished successfully, every prestart sidecar running
//!      ▼
//!  main tasks
//!      │ every main task has started
//!      ▼
//!  poststart (non-sidecar run to completion, sidecars keep running)
//!      ⋮  main tasks die (or the alloc stops); sidecars are then stopped
//!      ▼ every other task dead
//!  poststop (run to completion)
//! ```
//!
//! [`gates`] is pure: the alloc runner feeds it the task states after every change and opens
//! the gates it returns. Gates only ever open.

use std::collections::BTreeMap;

use nomad_proto::alloc::task_state;
use nomad_proto::job::lifecycle_hook;
use nomad_proto::{TaskLifecycle, TaskState};

/// When a task may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// `lifecycle { hook = "prestart" }`.
    Prestart,
    /// No lifecycle block.
    Main,
    /// `lifecycle { hook = "poststart" }`.
    Poststart,
    /// `lifecycle { hook = "poststop" }`.
    Poststop,
}

impl Stage {
    /// The stage of a task with this lifecycle block.
    pub fn of(lifecycle: Option<&TaskLifecycle>) -> Stage {
        match lifecycle.map(|l| l.hook.as_str()) {
            Some(lifecycle_hook::PRESTART) => Stage::Prestart,
            Some(lifecycle_hook::POSTSTART) => Stage::Poststart,
            Some(lifecycle_hook::POSTSTOP) => Stage::Poststop,
            _ => Stage::Main,
        }
    }
}

/// One task as the ordering sees it.
#[derive(Debug, Clone)]
pub struct TaskView<'a> {
    /// Stage.
    pub stage: Stage,
    /// Keeps running beside the main tasks.
    pub sidecar: bool,
    /// Current state.
    pub state: &'a TaskState,
}

/// Which stages may start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gates {
    /// Prestart tasks.
    pub prestart: bool,
    /// Main tasks.
    pub main: bool,
    /// Poststart tasks.
    pub poststart: bool,
    /// Poststop tasks.
    pub poststop: bool,
}

impl Gates {
    /// Whether `stage` may start.
    pub fn allows(&self, stage: Stage) -> bool {
        match stage {
            Stage::Prestart => self.prestart,
            Stage::Main => self.main,
            Stage::Poststart => self.poststart,
            Stage::Poststop => self.poststop,
        }
    }
}

fn dead(s: &TaskState) -> bool {
    s.state == task_state::DEAD
}

fn started(s: &TaskState) -> bool {
    s.state == task_state::RUNNING || !s.started_at.is_zero()
}

/// The gates open for these task states.
pub fn gates(tasks: &BTreeMap<String, TaskView<'_>>) -> Gates {
    let of = |stage: Stage| tasks.values().filter(move |t| t.stage == stage);
    let main = of(Stage::Prestart).all(|t| if t.sidecar { t.state.state == task_state::RUNNING } else { dead(t.state) && !t.state.failed });
    let poststart = main && of(Stage::Main).all(|t| started(t.state));
    let poststop = tasks.values().filter(|t| t.stage != Stage::Poststop).all(|t| dead(t.state));
    Gates { prestart: true, main, poststart, poststop }
}

#[cfg(test)]
mod tests {
    use nomad_proto::Timestamp;

    use super::*;

    fn st(state: &str, failed: bool, started: bool) -> TaskState {
        TaskState { state: state.into(), failed, started_at: if started { Timestamp(1) } else { Timestamp::ZERO }, ..TaskState::default() }
    }

    fn view<'a>(list: &'a [(&str, Stage, bool, TaskState)]) -> BTreeMap<String, TaskView<'a>> {
        list.iter().map(|(n, stage, sidecar, s)| (n.to_string(), TaskView { stage: *stage, sidecar: *sidecar, state: s })).collect()
    }

    #[test]
    fn ordering_through_an_alloc_life() {
        use Stage::*;
        let g = |list: &[(&str, Stage, bool, TaskState)]| gates(&view(list));
        // Nothing ran yet: only prestart.
        let s0 = [
            ("init", Prestart, false, st("pending", false, false)),
            ("proxy", Prestart, true, st("pending", false, false)),
            ("web", Main, false, st("pending", false, false)),
            ("announce", Poststart, false, st("pending", false, false)),
            ("cleanup", Poststop, false, st("pending", false, false)),
        ];
        assert_eq!(g(&s0), Gates { prestart: true, ..Gates::default() });
        // init still running: main waits even though the sidecar runs.
        let mut s1 = s0.clone();
        s1[0].3 = st("running", false, true);
        s1[1].3 = st("running", false, true);
        assert!(!g(&s1).main);
        // init finished, sidecar running: main may start.
        let mut s2 = s1.clone();
        s2[0].3 = st("dead", false, true);
        assert_eq!(g(&s2), Gates { prestart: true, main: true, ..Gates::default() });
        // A failed init never lets main start.
        let mut bad = s2.clone();
        bad[0].3 = st("dead", true, true);
        assert!(!g(&bad).main);
        // Main running: poststart may start; poststop waits.
        let mut s3 = s2.clone();
        s3[2].3 = st("running", false, true);
        assert_eq!(g(&s3), Gates { prestart: true, main: true, poststart: true, poststop: false });
        // A main task that already finished has still started.
        let mut s3b = s2.clone();
        s3b[2].3 = st("dead", false, true);
        assert!(g(&s3b).poststart);
        // Everything but poststop dead: poststop may start.
        let mut s4 = s3.clone();
        for t in s4.iter_mut().take(4) {
            t.3 = st("dead", false, true);
        }
        assert!(g(&s4).poststop);
    }

    #[test]
    fn stages_from_lifecycle_blocks() {
        let l = |hook: &str| TaskLifecycle { hook: hook.into(), sidecar: false };
        assert_eq!(Stage::of(None), Stage::Main);
        assert_eq!(Stage::of(Some(&l("prestart"))), Stage::Prestart);
        assert_eq!(Stage::of(Some(&l("poststart"))), Stage::Poststart);
        assert_eq!(Stage::of(Some(&l("poststop"))), Stage::Poststop);
    }
}
