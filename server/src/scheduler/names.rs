//! Alloc names `job.group[i]`: which indexes are taken, which to use next,
//! which to remove first (Nomad's `allocNameIndex`).
//!
//! The index holds the taken indexes only (not a slot per `count`), and hands out new
//! names one at a time, so a group whose `count` is far beyond what fits costs memory for
//! the names actually placed, not for the count.

use std::collections::BTreeSet;

use nomad_proto::Allocation;
use nomad_proto::alloc::alloc_name;

/// Taken name indexes of one group.
#[derive(Debug, Clone)]
pub(crate) struct NameIndex {
    job_id: String,
    group: String,
    count: u64,
    used: BTreeSet<u64>,
    /// No index below this is free (below `count`).
    next_free: u64,
    /// Where reuse from 0 continues once every index below `count` is taken.
    next_reuse: u64,
}

impl NameIndex {
    /// An index for `count` names seeded with the names of `taken`.
    pub(crate) fn new<'a>(job_id: &str, group: &str, count: i64, taken: impl IntoIterator<Item = &'a Allocation>) -> NameIndex {
        let used = taken.into_iter().map(Allocation::index).collect();
        NameIndex { job_id: job_id.to_string(), group: group.to_string(), count: count.max(0) as u64, used, next_free: 0, next_reuse: 0 }
    }

    /// Frees an index.
    pub(crate) fn unset(&mut self, i: u64) {
        self.used.remove(&i);
        self.next_free = self.next_free.min(i);
    }

    /// Takes and returns the highest `n` used names.
    pub(crate) fn highest(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::with_capacity(n.min(self.used.len()));
        while out.len() < n {
            let Some(i) = self.used.pop_last() else { break };
            out.push(alloc_name(&self.job_id, &self.group, i));
        }
        out
    }

    /// Takes the next free name below `count`; when none is free, indexes are reused from 0
    /// (as Nomad does).
    pub(crate) fn take_next(&mut self) -> String {
        while self.next_free < self.count && self.used.contains(&self.next_free) {
            self.next_free += 1;
        }
        let i = if self.next_free < self.count {
            self.next_free += 1;
            self.next_free - 1
        } else {
            self.next_reuse += 1;
            self.next_reuse - 1
        };
        self.used.insert(i);
        alloc_name(&self.job_id, &self.group, i)
    }

    /// Names for `n` canaries (Nomad's `NextCanaries`): first the names of allocs being
    /// replaced destructively (their replacements take them over), then free names below
    /// `count`, then names from `count` up; never a name an existing canary has. Its cost is
    /// the allocs and `n`, not the count.
    pub(crate) fn next_canaries<'a>(
        &mut self,
        n: usize,
        canaries: impl IntoIterator<Item = &'a Allocation>,
        destructive: impl IntoIterator<Item = &'a Allocation>,
    ) -> Vec<String> {
        let canary: BTreeSet<u64> = canaries.into_iter().map(Allocation::index).collect();
        let replaced: BTreeSet<u64> = destructive.into_iter().map(Allocation::index).filter(|i| *i < self.count).collect();
        let mut out = Vec::with_capacity(n);
        for i in replaced.into_iter().filter(|i| !canary.contains(i)) {
            if out.len() == n {
                return out;
            }
            self.used.insert(i);
            out.push(alloc_name(&self.job_id, &self.group, i));
        }
        let mut i = 0;
        while out.len() < n && i < self.count {
            if !self.used.contains(&i) && !canary.contains(&i) {
                self.used.insert(i);
                out.push(alloc_name(&self.job_id, &self.group, i));
            }
            i += 1;
        }
        let mut i = self.count;
        while out.len() < n {
            out.push(alloc_name(&self.job_id, &self.group, i));
            i += 1;
        }
        out
    }

    /// Takes the next `n` names (see [`NameIndex::take_next`]).
    #[cfg(test)]
    pub(crate) fn next(&mut self, n: usize) -> Vec<String> {
        (0..n).map(|_| self.take_next()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(i: u64) -> Allocation {
        Allocation { name: alloc_name("j", "g", i), ..Allocation::default() }
    }

    #[test]
    fn next_fills_gaps_first() {
        let taken = [alloc(0), alloc(2)];
        let mut idx = NameIndex::new("j", "g", 4, taken.iter());
        assert_eq!(idx.next(3), vec!["j.g[1]", "j.g[3]", "j.g[0]"]);
    }

    #[test]
    fn highest_takes_from_the_top() {
        let taken = [alloc(0), alloc(1), alloc(5)];
        let mut idx = NameIndex::new("j", "g", 2, taken.iter());
        assert_eq!(idx.highest(2), vec!["j.g[5]", "j.g[1]"]);
        assert_eq!(idx.highest(5), vec!["j.g[0]"]);
    }

    #[test]
    fn canaries_take_the_names_being_replaced_then_free_ones_then_names_past_count() {
        let (a0, a1, a2) = (alloc(0), alloc(1), alloc(2));
        let mut idx = NameIndex::new("j", "g", 3, [&a0, &a1, &a2]);
        assert_eq!(idx.next_canaries(2, [], [&a2, &a1]), vec!["j.g[1]", "j.g[2]"]);
        // An existing canary keeps its name; five canaries for a count of 3 go past it.
        let mut idx = NameIndex::new("j", "g", 3, [&a0, &a1]);
        assert_eq!(idx.next_canaries(4, [&a0], [&a0, &a1]), vec!["j.g[1]", "j.g[2]", "j.g[3]", "j.g[4]"]);
        // A huge count is not walked.
        let mut idx = NameIndex::new("j", "g", 1 << 40, [&a1]);
        assert_eq!(idx.next_canaries(2, [], []), vec!["j.g[0]", "j.g[2]"]);
    }

    #[test]
    fn a_huge_count_costs_nothing_until_names_are_taken() {
        let taken = [alloc(1)];
        let mut idx = NameIndex::new("j", "g", 1 << 40, taken.iter());
        assert_eq!(idx.next(2), vec!["j.g[0]", "j.g[2]"]);
        assert_eq!(idx.used.len(), 3);
        idx.unset(1);
        assert_eq!(idx.take_next(), "j.g[1]", "a freed index is handed out first");
    }
}
