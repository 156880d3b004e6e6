//! How many of a job's allocs sit on each value of a node property
//! (`distinct_property` limits and `spread` scoring).
//!
//! Counts start from the snapshot's live allocs of the job (optionally of
//! one group) and follow the plan through the [`Proposed`] journal.

use std::collections::{HashMap, HashSet};

use nomad_proto::Node;

use super::constraint::Target;
use super::proposed::Proposed;

/// The value spreads use for "any value not listed in the targets".
pub(crate) const IMPLICIT_TARGET: &str = "*";

/// Use counts of one property for one job (or one of its groups).
#[derive(Debug, Clone)]
pub(crate) struct PropertySet {
    attribute: String,
    target: Target,
    group: Option<String>,
    /// Values listed by a spread; others count under [`IMPLICIT_TARGET`].
    target_values: HashSet<String>,
    /// Set when the constraint itself is invalid (`distinct_property` count).
    error: Option<String>,
    counts: HashMap<String, i64>,
    cursor: usize,
}

impl PropertySet {
    /// Counts over `attribute` (`${meta.rack}`), for `group` or the whole job.
    pub(crate) fn new(
        proposed: &Proposed<'_>,
        namespace: &str,
        job_id: &str,
        attribute: &str,
        group: Option<&str>,
        target_values: HashSet<String>,
    ) -> PropertySet {
        let mut set = PropertySet {
            attribute: attribute.to_string(),
            target: Target::parse(attribute),
            group: group.map(str::to_string),
            target_values,
            error: None,
            counts: HashMap::new(),
            cursor: 0,
        };
        let state = proposed.state();
        for a in state.allocs_by_job(namespace, job_id) {
            if a.terminal() || set.group.as_deref().is_some_and(|g| g != a.task_group) {
                continue;
            }
            if let Some(node) = state.node(&a.node_id) {
                set.bump(node, 1);
            }
        }
        set.sync(proposed);
        set
    }

    /// A set whose every lookup fails with `error`.
    pub(crate) fn invalid(attribute: &str, error: String) -> PropertySet {
        PropertySet {
            attribute: attribute.to_string(),
            target: Target::Unresolvable,
            group: None,
            target_values: HashSet::new(),
            error: Some(error),
            counts: HashMap::new(),
            cursor: 0,
        }
    }

    fn targeted<'v>(&self, value: &'v str) -> &'v str {
        if self.target_values.is_empty() || self.target_values.contains(value) { value } else { IMPLICIT_TARGET }
    }

    fn bump(&mut self, node: &Node, delta: i64) {
        if let Some(v) = self.target.resolve(node) {
            let key = self.targeted(v).to_string();
            *self.counts.entry(key).or_insert(0) += delta;
        }
    }

    /// Applies plan changes made since the last call.
    pub(crate) fn sync(&mut self, proposed: &Proposed<'_>) {
        let journal = proposed.journal();
        if self.cursor >= journal.len() || self.error.is_some() {
            self.cursor = journal.len();
            return;
        }
        let state = proposed.state();
        for c in &journal[self.cursor..] {
            if self.group.as_deref().is_some_and(|g| g != c.group) {
                continue;
            }
            if let Some(node) = state.node(&c.node_id) {
                self.bump(node, c.delta);
            }
        }
        self.cursor = journal.len();
    }

    /// The node's (targeted) value and how many allocs already use it.
    pub(crate) fn used_count(&self, node: &Node) -> Result<(String, u64), String> {
        if let Some(e) = &self.error {
            return Err(e.clone());
        }
        let Some(v) = self.target.resolve(node) else {
            return Err(format!("missing property {:?}", self.attribute));
        };
        let v = self.targeted(v);
        Ok((v.to_string(), self.count(v)))
    }

    fn count(&self, value: &str) -> u64 {
        self.counts.get(value).copied().unwrap_or(0).max(0) as u64
    }

    /// Current counts of every value that has had allocs (values whose
    /// allocs the plan stops stay with zero, as in Nomad's combined map).
    pub(crate) fn combined(&self) -> impl Iterator<Item = (&str, u64)> {
        self.counts.iter().map(|(k, c)| (k.as_str(), (*c).max(0) as u64))
    }

    /// The count for the node's raw value (even spread looks values up untargeted).
    pub(crate) fn count_of_node_value(&self, node: &Node) -> Option<u64> {
        self.target.resolve(node).map(|v| self.count(v))
    }

    /// `distinct_property`: the node's value is used fewer than `allowed` times.
    pub(crate) fn satisfies(&self, node: &Node, allowed: u64) -> Result<(), String> {
        let (value, used) = self.used_count(node)?;
        if used < allowed { Ok(()) } else { Err(format!("distinct_property: {}={} used by {} allocs", self.attribute, value, used)) }
    }
}
