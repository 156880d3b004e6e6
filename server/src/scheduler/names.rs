//! Alloc names `job.group[i]`: which indexes are taken, which to use next,
//! which to remove first (Nomad's `allocNameIndex`).

use nomad_proto::Allocation;
use nomad_proto::alloc::alloc_name;

/// Taken name indexes of one group.
#[derive(Debug, Clone)]
pub(crate) struct NameIndex {
    job_id: String,
    group: String,
    count: usize,
    used: Vec<bool>,
}

impl NameIndex {
    /// An index sized for `count` and seeded with the names of `taken`.
    pub(crate) fn new<'a>(job_id: &str, group: &str, count: i64, taken: impl IntoIterator<Item = &'a Allocation>) -> NameIndex {
        let count = count.max(0) as usize;
        let mut idx = NameIndex { job_id: job_id.to_string(), group: group.to_string(), count, used: vec![false; count] };
        for a in taken {
            idx.set(a.index() as usize);
        }
        idx
    }

    fn set(&mut self, i: usize) {
        if i >= self.used.len() {
            self.used.resize(i + 1, false);
        }
        self.used[i] = true;
    }

    /// Frees an index.
    pub(crate) fn unset(&mut self, i: usize) {
        if let Some(u) = self.used.get_mut(i) {
            *u = false;
        }
    }

    /// Takes and returns the highest `n` used names.
    pub(crate) fn highest(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::with_capacity(n);
        for i in (0..self.used.len()).rev() {
            if out.len() == n {
                break;
            }
            if self.used[i] {
                self.used[i] = false;
                out.push(alloc_name(&self.job_id, &self.group, i as u64));
            }
        }
        out
    }

    /// Takes the next `n` free names below `count`; when none are free,
    /// indexes are reused from 0 (as Nomad does).
    pub(crate) fn next(&mut self, n: usize) -> Vec<String> {
        let mut out = Vec::with_capacity(n);
        for i in 0..self.count {
            if out.len() == n {
                return out;
            }
            if !self.used[i] {
                self.used[i] = true;
                out.push(alloc_name(&self.job_id, &self.group, i as u64));
            }
        }
        let mut i = 0;
        while out.len() < n {
            self.set(i);
            out.push(alloc_name(&self.job_id, &self.group, i as u64));
            i += 1;
        }
        out
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
}
