//! Spread scoring (`spread {}` on the job or group), as Nomad's `SpreadIterator`.
//!
//! With targets, a node scores by how far its value is below the value's
//! desired count (percent of `count`; unlisted values share the remainder).
//! Without targets, values are evened out: the least used values win.

use std::collections::{HashMap, HashSet};

use nomad_proto::{Job, Node, TaskGroup};

use super::property_set::{IMPLICIT_TARGET, PropertySet};
use super::proposed::Proposed;

struct SpreadInfo {
    weight: f64,
    desired: HashMap<String, f64>,
}

/// The spreads that apply to one group.
pub(crate) struct Spreads {
    sets: Vec<(PropertySet, SpreadInfo)>,
    sum_weights: f64,
    /// The lowest boost seen so far; values with a zero desired count get it.
    lowest_boost: f64,
}

impl Spreads {
    pub(crate) fn new(proposed: &Proposed<'_>, job: &Job, tg: &TaskGroup) -> Spreads {
        let count = tg.count as f64;
        let mut infos: HashMap<&str, SpreadInfo> = HashMap::new();
        let mut sum_weights = 0.0;
        for s in tg.spreads.iter().chain(&job.spreads) {
            let mut desired = HashMap::new();
            let mut sum = 0.0;
            for t in &s.spread_target {
                let d = t.percent as f64 / 100.0 * count;
                desired.insert(t.value.clone(), d);
                sum += d;
            }
            if sum > 0.0 && sum < count {
                desired.insert(IMPLICIT_TARGET.to_string(), count - sum);
            }
            infos.insert(&s.attribute, SpreadInfo { weight: s.weight as f64, desired });
            sum_weights += s.weight as f64;
        }
        let mut sets = Vec::new();
        for s in job.spreads.iter().chain(&tg.spreads) {
            let targets: HashSet<String> = s.spread_target.iter().map(|t| t.value.clone()).collect();
            let set = PropertySet::new(proposed, &job.namespace, &job.id, &s.attribute, Some(&tg.name), targets);
            let info = infos.get(s.attribute.as_str()).map(|i| SpreadInfo { weight: i.weight, desired: i.desired.clone() });
            if let Some(info) = info {
                sets.push((set, info));
            }
        }
        Spreads { sets, sum_weights, lowest_boost: -1.0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    /// Follows the plan's changes.
    pub(crate) fn sync(&mut self, proposed: &Proposed<'_>) {
        for (set, _) in &mut self.sets {
            set.sync(proposed);
        }
    }

    /// The node's total spread boost (0 means "not recorded").
    pub(crate) fn score(&mut self, node: &Node) -> f64 {
        let mut total = 0.0;
        for (set, info) in &self.sets {
            let (value, used) = match set.used_count(node) {
                Ok(v) => v,
                Err(_) => {
                    total -= 1.0;
                    continue;
                }
            };
            // Count the placement being scored.
            let used = used + 1;
            if info.desired.is_empty() {
                total += even_spread_boost(set, node);
                continue;
            }
            let Some(desired) = info.desired.get(&value).or_else(|| info.desired.get(IMPLICIT_TARGET)).copied() else {
                total -= 1.0;
                continue;
            };
            let weight = if self.sum_weights > 0.0 { info.weight / self.sum_weights } else { 0.0 };
            if desired == 0.0 {
                total += self.lowest_boost;
                continue;
            }
            let boost = (desired - used as f64) / desired * weight;
            total += boost;
            self.lowest_boost = self.lowest_boost.min(boost);
        }
        total
    }
}

/// Even spread: favour values with the fewest allocs.
fn even_spread_boost(set: &PropertySet, node: &Node) -> f64 {
    let mut any = false;
    let (mut min, mut max) = (0u64, 0u64);
    for (_, c) in set.combined() {
        any = true;
        if min == 0 || c < min {
            min = c;
        }
        if max == 0 || c > max {
            max = c;
        }
    }
    if !any {
        return 0.0;
    }
    let Some(current) = set.count_of_node_value(node) else { return -1.0 };
    let delta_boost = if min == 0 { -1.0 } else { (min as f64 - current as f64) / min as f64 };
    if current != min {
        delta_boost
    } else if min == max {
        -1.0
    } else if min == 0 {
        1.0
    } else {
        (max - min) as f64 / min as f64
    }
}
