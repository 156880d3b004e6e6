//! Every ordering of the returning client's four calls, with the scheduler
//! run (to completion) in every subset of the five gaps around them:
//! 4! × 2⁵ = 768 orderings per scenario, for every scenario of the grid
//! (56 service scenarios, 28 system ones).
//!
//! The orderings share prefixes, so they run as a walk of their prefix tree:
//! each distinct prefix is executed once and the world is forked where
//! orderings part (1,265 steps instead of 4,992 per scenario); every
//! ordering still ends with its own settle and end checks.

use std::collections::BTreeMap;

use crate::world::{Kind, Scenario, Step, World, codes, grid};

const CALLS: [Step; 4] = [Step::Register, Step::Heartbeat, Step::UpdateAlloc, Step::Pull];

/// All permutations of `items`.
pub fn permutations<T: Copy>(items: &[T]) -> Vec<Vec<T>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let first = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, first);
            out.push(p);
        }
    }
    out
}

/// The 768 orderings: a permutation of the calls, with `Schedule` in the gaps set in the mask.
pub fn orderings() -> Vec<Vec<Step>> {
    let mut out = Vec::new();
    for perm in permutations(&CALLS) {
        for mask in 0u32..32 {
            let mut steps = Vec::new();
            for (gap, call) in perm.iter().enumerate() {
                if mask & (1 << gap) != 0 {
                    steps.push(Step::Schedule);
                }
                steps.push(*call);
            }
            if mask & (1 << 4) != 0 {
                steps.push(Step::Schedule);
            }
            out.push(steps);
        }
    }
    out
}

/// A prefix tree of step sequences.
#[derive(Default)]
struct Trie {
    /// An ordering ends here.
    leaf: bool,
    children: BTreeMap<char, (Step, Trie)>,
}

impl Trie {
    fn of(seqs: &[Vec<Step>]) -> Trie {
        let mut root = Trie::default();
        for s in seqs {
            let mut node = &mut root;
            for &step in s {
                node = &mut node.children.entry(step.code()).or_insert_with(|| (step, Trie::default())).1;
            }
            node.leaf = true;
        }
        root
    }

    fn nodes(&self) -> usize {
        self.children.values().map(|(_, t)| 1 + t.nodes()).sum()
    }
}

struct Sweep {
    runs: usize,
    steps: usize,
    failures: Vec<String>,
}

impl Sweep {
    /// Runs every ordering below `node`, `w` being the world after `path`.
    fn walk(&mut self, sc: &Scenario, w: World, path: &mut Vec<Step>, node: &Trie) {
        if self.failures.len() >= 3 {
            return;
        }
        if node.leaf {
            self.runs += 1;
            let mut end = w.fork();
            end.note("-- settle --".into());
            if let Err(e) = end.settle().and_then(|_| end.check_end()) {
                self.fail(sc, path, &end, e);
            }
        }
        for (step, child) in node.children.values() {
            let mut next = w.fork();
            path.push(*step);
            self.steps += 1;
            match next.step(*step) {
                Ok(()) => self.walk(sc, next, path, child),
                Err(e) => self.fail(sc, path, &next, e),
            }
            path.pop();
        }
    }

    fn fail(&mut self, sc: &Scenario, path: &[Step], w: &World, e: String) {
        self.failures.push(format!("scenario {sc}\n  {e}\n  steps: {}\n  trace:\n    {}", codes(path), w.trace()));
    }
}

/// Runs every ordering for every scenario `pick` selects; panics with the
/// first failures (scenario, ordering, step trace).
fn sweep(pick: impl Fn(&Scenario) -> bool) {
    let scenarios: Vec<Scenario> = grid().into_iter().filter(|s| pick(s)).collect();
    let orderings = orderings();
    let trie = Trie::of(&orderings);
    let start = std::time::Instant::now();
    let mut sweep = Sweep { runs: 0, steps: 0, failures: Vec::new() };
    for sc in &scenarios {
        let prefix = World::prefix(*sc).unwrap_or_else(|e| panic!("scenario {sc}: setting up: {e}"));
        sweep.walk(sc, prefix, &mut Vec::new(), &trie);
    }
    eprintln!(
        "exhaustive: {} scenarios × {} orderings = {} runs ({} shared prefix steps) in {:.1?}",
        scenarios.len(),
        orderings.len(),
        sweep.runs,
        sweep.steps,
        start.elapsed()
    );
    let failures = &sweep.failures;
    assert!(failures.is_empty(), "failing orderings (first ones shown):\n{}", failures.join("\n\n"));
    assert_eq!(sweep.runs, scenarios.len() * orderings.len());
}

#[test]
fn there_are_768_distinct_orderings() {
    let o = orderings();
    assert_eq!(o.len(), 768);
    let distinct: std::collections::BTreeSet<String> = o.iter().map(|s| codes(s)).collect();
    assert_eq!(distinct.len(), 768);
    assert_eq!(Trie::of(&o).nodes(), 1265);
}

#[test]
fn one_alloc_with_max_client_disconnect_and_a_spare_node() {
    sweep(|s| s.kind == Kind::Service && s.count == 1 && s.max_disconnect && s.spare);
}

#[test]
fn one_alloc_with_max_client_disconnect_and_no_spare_node() {
    sweep(|s| s.kind == Kind::Service && s.count == 1 && s.max_disconnect && !s.spare);
}

#[test]
fn one_alloc_without_max_client_disconnect() {
    sweep(|s| s.kind == Kind::Service && s.count == 1 && !s.max_disconnect);
}

#[test]
fn two_allocs_with_max_client_disconnect_and_a_spare_node() {
    sweep(|s| s.kind == Kind::Service && s.count == 2 && s.max_disconnect && s.spare);
}

#[test]
fn two_allocs_with_max_client_disconnect_and_no_spare_node() {
    sweep(|s| s.kind == Kind::Service && s.count == 2 && s.max_disconnect && !s.spare);
}

#[test]
fn two_allocs_without_max_client_disconnect() {
    sweep(|s| s.kind == Kind::Service && s.count == 2 && !s.max_disconnect);
}

#[test]
fn system_job_with_max_client_disconnect_and_a_spare_node() {
    sweep(|s| s.kind == Kind::System && s.max_disconnect && s.spare);
}

#[test]
fn system_job_with_max_client_disconnect_and_no_spare_node() {
    sweep(|s| s.kind == Kind::System && s.max_disconnect && !s.spare);
}

#[test]
fn system_job_without_max_client_disconnect_and_a_spare_node() {
    sweep(|s| s.kind == Kind::System && !s.max_disconnect && s.spare);
}

#[test]
fn system_job_without_max_client_disconnect_and_no_spare_node() {
    sweep(|s| s.kind == Kind::System && !s.max_disconnect && !s.spare);
}

#[test]
fn the_grid_has_56_service_and_28_system_scenarios() {
    let g = grid();
    assert_eq!(g.iter().filter(|s| s.kind == Kind::Service).count(), 56);
    assert_eq!(g.iter().filter(|s| s.kind == Kind::System).count(), 28);
    assert!(g.iter().filter(|s| s.kind == Kind::System).all(|s| s.count == 1));
}
