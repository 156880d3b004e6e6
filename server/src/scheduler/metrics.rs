//! Recording how a placement was decided (`AllocMetric`).
//!
//! Scores are kept in a fixed-size record per node while ranking and only
//! the best [`MAX_RETAINED_NODE_SCORES`] are turned into `NodeScoreMeta`
//! maps, so ranking a node allocates nothing.

use std::collections::BTreeMap;

use nomad_proto::alloc::NodeScoreMeta;
use nomad_proto::{AllocMetric, Node, TaskGroup};

/// Nodes whose scores are kept on a metric, as Nomad.
pub(crate) const MAX_RETAINED_NODE_SCORES: usize = 5;

/// Scorer names as they appear in `ScoreMetaData`.
pub(crate) mod scorer {
    pub(crate) const BINPACK: &str = "binpack";
    pub(crate) const JOB_ANTI_AFFINITY: &str = "job-anti-affinity";
    pub(crate) const RESCHEDULE_PENALTY: &str = "node-reschedule-penalty";
    pub(crate) const NODE_AFFINITY: &str = "node-affinity";
    pub(crate) const SPREAD: &str = "allocation-spread";
}

fn bump(map: &mut BTreeMap<String, i64>, key: &str) {
    match map.get_mut(key) {
        Some(v) => *v += 1,
        None => {
            map.insert(key.to_string(), 1);
        }
    }
}

/// A node was filtered out by a constraint (or a checker named `reason`).
pub(crate) fn filter_node(m: &mut AllocMetric, node: &Node, reason: &str) {
    m.nodes_filtered += 1;
    if !node.node_class.is_empty() {
        bump(&mut m.class_filtered, &node.node_class);
    }
    if !reason.is_empty() {
        bump(&mut m.constraint_filtered, reason);
    }
}

/// A feasible node had no room in `dimension`.
pub(crate) fn exhausted_node(m: &mut AllocMetric, node: &Node, dimension: &str) {
    m.nodes_exhausted += 1;
    if !node.node_class.is_empty() {
        bump(&mut m.class_exhausted, &node.node_class);
    }
    if !dimension.is_empty() {
        bump(&mut m.dimension_exhausted, dimension);
    }
}

/// Adds the group's asks, `times` over (one per failed placement), to `ResourcesExhausted`
/// for the dimensions that ran out. The sums saturate: the asks are untrusted.
pub(crate) fn exhaust_resources(m: &mut AllocMetric, tg: &TaskGroup, times: i64) {
    if m.dimension_exhausted.is_empty() {
        return;
    }
    let (mem, cpu) = (m.dimension_exhausted.contains_key("memory"), m.dimension_exhausted.contains_key("cpu"));
    for t in &tg.tasks {
        let entry = m.resources_exhausted.entry(t.name.clone()).or_insert_with(|| serde_json::json!({"CPU": 0, "MemoryMB": 0}));
        let add = |v: &mut serde_json::Value, key: &str, n: i64| {
            let cur = v.get(key).and_then(|x| x.as_i64()).unwrap_or(0);
            v[key] = serde_json::json!(cur.saturating_add(n.saturating_mul(times)));
        };
        if mem {
            add(entry, "MemoryMB", t.resources.memory_mb);
        }
        if cpu {
            add(entry, "CPU", t.resources.cpu);
        }
    }
}

/// The scores one node got, in the order the scorers ran.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeScores {
    entries: [(&'static str, f64); 6],
    len: usize,
    /// Scores that count towards the final (normalized) score.
    sum: f64,
    counted: usize,
}

impl NodeScores {
    /// Records a score that takes part in normalization.
    pub(crate) fn add(&mut self, name: &'static str, score: f64) {
        self.record(name, score);
        self.sum += score;
        self.counted += 1;
    }

    /// Records a score shown in metrics but not normalized (Nomad's zero entries).
    pub(crate) fn record(&mut self, name: &'static str, score: f64) {
        if self.len < self.entries.len() {
            self.entries[self.len] = (name, score);
            self.len += 1;
        }
    }

    /// The average of the counted scores (Nomad's `ScoreNormalizationIterator`).
    pub(crate) fn normalized(&self) -> Option<f64> {
        (self.counted > 0).then(|| self.sum / self.counted as f64)
    }
}

/// The best scoring nodes of one placement attempt.
#[derive(Debug, Default)]
pub(crate) struct ScoreBoard<'n> {
    top: Vec<(f64, &'n str, NodeScores)>,
}

impl<'n> ScoreBoard<'n> {
    /// Offers a scored node.
    pub(crate) fn offer(&mut self, norm: f64, node_id: &'n str, scores: &NodeScores) {
        if self.top.len() == MAX_RETAINED_NODE_SCORES {
            match self.top.last() {
                Some((worst, _, _)) if norm > *worst => {
                    self.top.pop();
                }
                _ => return,
            }
        }
        let pos = self.top.iter().position(|(s, _, _)| norm > *s).unwrap_or(self.top.len());
        self.top.insert(pos, (norm, node_id, scores.clone()));
    }

    /// Writes `ScoreMetaData`, best first.
    pub(crate) fn populate(&self, m: &mut AllocMetric) {
        m.score_meta_data = self
            .top
            .iter()
            .map(|(norm, id, s)| NodeScoreMeta {
                node_id: (*id).to_string(),
                scores: s.entries[..s.len].iter().map(|(k, v)| ((*k).to_string(), *v)).collect(),
                norm_score: *norm,
            })
            .collect();
    }
}
