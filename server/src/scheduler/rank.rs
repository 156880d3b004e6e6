//! Scoring feasible nodes: bin packing, job anti-affinity, reschedule
//! penalty and affinities. Each scorer gives a value in about [-1, 1]; the
//! final score is their average (Nomad's `ScoreNormalizationIterator`).

use nomad_proto::{Job, Node, TaskGroup};

use super::constraint::CompiledConstraint;
use super::usage::Capacity;

/// Nomad's maximum bin-packing fitness (`binPackingMaxFitScore`).
const BINPACK_MAX_FIT_SCORE: f64 = 18.0;

/// Nomad's `ScoreFitBinPack` divided by its maximum: fuller nodes score higher.
pub(crate) fn binpack_score(cap: Capacity, cpu_used: i128, memory_used: i128) -> f64 {
    let free = |used: i128, total: i64| if total > 0 { 1.0 - used as f64 / total as f64 } else { 0.0 };
    let total = 10f64.powf(free(cpu_used, cap.cpu)) + 10f64.powf(free(memory_used, cap.memory));
    (20.0 - total).clamp(0.0, BINPACK_MAX_FIT_SCORE) / BINPACK_MAX_FIT_SCORE
}

/// Penalty for co-locating with `collisions` allocs of the same job and group.
pub(crate) fn anti_affinity_score(collisions: u32, desired_count: i64) -> Option<f64> {
    (collisions > 0 && desired_count > 0).then(|| -((collisions + 1) as f64) / desired_count as f64)
}

/// Job, group and task affinities of one group, with their weights.
#[derive(Debug, Clone, Default)]
pub(crate) struct Affinities {
    list: Vec<(CompiledConstraint, f64)>,
    sum_abs_weight: f64,
}

impl Affinities {
    pub(crate) fn new(job: &Job, tg: &TaskGroup) -> Affinities {
        let all = job.affinities.iter().chain(&tg.affinities).chain(tg.tasks.iter().flat_map(|t| t.affinities.iter()));
        let list: Vec<(CompiledConstraint, f64)> = all
            .map(|a| {
                let c = nomad_proto::Constraint { l_target: a.l_target.clone(), r_target: a.r_target.clone(), operand: a.operand.clone() };
                (CompiledConstraint::new(&c), a.weight as f64)
            })
            .collect();
        let sum_abs_weight = list.iter().map(|(_, w)| w.abs()).sum();
        Affinities { list, sum_abs_weight }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The weighted share of matching affinities; `None` when nothing matched.
    pub(crate) fn score(&self, node: &Node) -> Option<f64> {
        if self.sum_abs_weight == 0.0 {
            return None;
        }
        let total: f64 = self.list.iter().filter(|(c, _)| c.matches(node)).map(|(_, w)| w).sum();
        (total != 0.0).then(|| total / self.sum_abs_weight)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binpack_prefers_fuller_nodes_and_is_bounded() {
        let cap = Capacity { cpu: 4000, memory: 8192, disk: 0 };
        let empty = binpack_score(cap, 0, 0);
        let half = binpack_score(cap, 2000, 4096);
        let full = binpack_score(cap, 4000, 8192);
        assert_eq!(empty, 0.0, "20 - (10 + 10) = 0");
        assert!((full - 1.0).abs() < 1e-9, "18 / 18");
        assert!(empty < half && half < full);
        // 20 - 2 * 10^0.5 = 13.675..., over 18.
        assert!((half - (20.0 - 2.0 * 10f64.sqrt()) / 18.0).abs() < 1e-12);
    }

    #[test]
    fn anti_affinity_grows_with_collisions() {
        assert_eq!(anti_affinity_score(0, 3), None);
        assert_eq!(anti_affinity_score(1, 4), Some(-0.5));
        assert_eq!(anti_affinity_score(3, 4), Some(-1.0));
    }
}
