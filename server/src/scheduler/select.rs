//! Choosing a node for one placement (Nomad's generic and system stacks).
//!
//! ```text
//!  shuffled nodes ─▶ feasibility (class-memoized) ─▶ distinct hosts/property
//!     ─▶ fit (cpu, memory, disk, cores, ports) ─▶ scores ─▶ limit ─▶ best score
//! ```
//!
//! The generic stack walks a shuffled node list from where the previous
//! placement stopped and scores only the first `limit` nodes that fit: 2 for
//! batch jobs, `max(2, ceil(log2(nodes)))` for services, and at least 100
//! (or the group count) when the group has affinities or spreads. Up to 3
//! nodes scoring 0 or less are skipped while better ones may follow. The
//! system stack evaluates exactly the node it is given.

use std::sync::Arc;

use nomad_proto::{AllocMetric, AllocatedResources, Job, Node, TaskGroup};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::constraint::DISTINCT_PROPERTY;
use super::csi::CsiChecks;
use super::feasible::{Feasibility, has_distinct_hosts};
use super::fit::{Fit, GroupAsk, fit};
use super::metrics::{NodeScores, ScoreBoard, exhausted_node, filter_node, scorer};
use super::property_set::PropertySet;
use super::proposed::Proposed;
use super::rank::{Affinities, anti_affinity_score, binpack_score};
use super::spread::Spreads;
use super::usage::Capacity;

const MAX_SKIP: usize = 3;
const SKIP_SCORE_THRESHOLD: f64 = 0.0;
const AFFINITY_SPREAD_LIMIT: usize = 100;

/// Which pipeline to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StackKind {
    /// Service jobs: log2 limit, all scorers.
    Service,
    /// Batch jobs: power of two choices.
    Batch,
    /// System and sysbatch: one given node, bin packing only.
    System,
}

/// Per-placement inputs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SelectOptions<'o> {
    /// Name of the alloc being placed (per-alloc volumes use it).
    pub(crate) alloc_name: &'o str,
    /// Nodes a rescheduled alloc already failed on.
    pub(crate) penalty_nodes: &'o [String],
}

/// The node chosen and what the alloc gets there.
#[derive(Debug)]
pub(crate) struct Selection<'a> {
    pub(crate) node: &'a Node,
    pub(crate) resources: AllocatedResources,
}

struct Candidate<'a> {
    node: &'a Node,
    fit: Fit,
    score: f64,
}

struct GroupState {
    ask: GroupAsk,
    affinities: Affinities,
    spreads: Option<Spreads>,
    distinct_hosts: bool,
    distinct_props: Option<Vec<(PropertySet, u64)>>,
}

/// A derived seed: the same eval on the same snapshot shuffles the same way.
pub(crate) fn seed_for(eval_id: &str, index: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in eval_id.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^ index.rotate_left(32)
}

/// The placement stack of one eval.
pub(crate) struct Stack<'a> {
    job: Arc<Job>,
    kind: StackKind,
    nodes: Vec<&'a Node>,
    /// Nodes before this index are in their final shuffled position.
    shuffled: usize,
    offset: usize,
    base_limit: usize,
    feasibility: Feasibility,
    /// CSI volumes: per node and per claim, never memoized per class.
    csi: CsiChecks,
    groups: Vec<GroupState>,
    job_distinct_hosts: bool,
    job_props: Option<Vec<(PropertySet, u64)>>,
    rng: StdRng,
    /// Reused between placements (candidates carry port offers).
    arena: Vec<Candidate<'a>>,
}

impl<'a> Stack<'a> {
    pub(crate) fn new(job: Arc<Job>, kind: StackKind, seed: u64) -> Stack<'a> {
        let groups = job
            .task_groups
            .iter()
            .map(|tg| GroupState {
                ask: GroupAsk::new(tg),
                affinities: if kind == StackKind::System { Affinities::default() } else { Affinities::new(&job, tg) },
                spreads: None,
                distinct_hosts: has_distinct_hosts(&tg.constraints),
                distinct_props: None,
            })
            .collect();
        Stack {
            feasibility: Feasibility::new(&job),
            csi: CsiChecks::new(&job),
            job_distinct_hosts: has_distinct_hosts(&job.constraints),
            job,
            kind,
            nodes: Vec::new(),
            shuffled: 0,
            offset: 0,
            base_limit: 2,
            groups,
            job_props: None,
            rng: StdRng::seed_from_u64(seed),
            arena: Vec::new(),
        }
    }

    /// Sets the candidate nodes. They are visited in a random order (seeded
    /// by the eval), shuffled lazily as the walk reaches them.
    pub(crate) fn set_nodes(&mut self, nodes: Vec<&'a Node>) {
        let n = nodes.len();
        self.base_limit = match self.kind {
            StackKind::Service if n > 0 => ((n as f64).log2().ceil() as usize).max(2),
            _ => 2,
        };
        self.nodes = nodes;
        self.shuffled = 0;
        self.offset = 0;
    }

    pub(crate) fn feasibility(&self) -> &Feasibility {
        &self.feasibility
    }

    fn prepare(&mut self, proposed: &Proposed<'a>, group: usize) {
        let job = self.job.clone();
        let tg = &job.task_groups[group];
        let props = self.job_props.get_or_insert_with(|| distinct_props(proposed, &job, &job.constraints, None));
        props.iter_mut().for_each(|(s, _)| s.sync(proposed));
        let gs = &mut self.groups[group];
        let props = gs.distinct_props.get_or_insert_with(|| distinct_props(proposed, &job, &tg.constraints, Some(&tg.name)));
        props.iter_mut().for_each(|(s, _)| s.sync(proposed));
        if self.kind != StackKind::System {
            let spreads = gs.spreads.get_or_insert_with(|| Spreads::new(proposed, &job, tg));
            spreads.sync(proposed);
        }
    }

    /// Picks the best node for group `group` among the candidates.
    pub(crate) fn select(
        &mut self,
        proposed: &mut Proposed<'a>,
        group: usize,
        opts: SelectOptions<'_>,
    ) -> (Option<Selection<'a>>, AllocMetric) {
        self.prepare(proposed, group);
        let job = self.job.clone();
        let tg = &job.task_groups[group];
        let gs = &self.groups[group];
        let spreads = gs.spreads.as_ref().is_some_and(|s| !s.is_empty());
        let limit =
            if !gs.affinities.is_empty() || spreads { (tg.count.max(0) as usize).max(AFFINITY_SPREAD_LIMIT) } else { self.base_limit };

        let mut metric = AllocMetric::default();
        let mut board = ScoreBoard::default();
        let mut pulled = 0;
        // Candidates live in an arena; the limit logic passes indexes around.
        let mut arena = std::mem::take(&mut self.arena);
        arena.clear();
        let mut pull = |this: &mut Self, arena: &mut Vec<Candidate<'a>>, metric: &mut AllocMetric, board: &mut ScoreBoard<'a>| {
            let c = this.next_candidate(proposed, group, tg, opts, metric, board, &mut pulled)?;
            arena.push(c);
            Some(arena.len() - 1)
        };

        // Nomad's LimitIterator feeding a MaxScoreIterator.
        let (mut skipped, mut skip_idx, mut seen) = (Vec::<usize>::new(), 0, 0);
        let mut best: Option<usize> = None;
        while seen < limit {
            let mut option = pull(self, &mut arena, &mut metric, &mut board);
            if option.is_none() && skip_idx < skipped.len() {
                option = Some(skipped[skip_idx]);
                skip_idx += 1;
            }
            let Some(mut chosen) = option else { break };
            let mut current = Some(chosen);
            // Skip low scorers while better nodes may follow.
            while let Some(i) = current {
                if skipped.len() >= MAX_SKIP || arena[i].score > SKIP_SCORE_THRESHOLD {
                    break;
                }
                skipped.push(i);
                current = pull(self, &mut arena, &mut metric, &mut board);
            }
            seen += 1;
            match current {
                Some(i) => chosen = i,
                None => {
                    let next = pull(self, &mut arena, &mut metric, &mut board).or_else(|| {
                        let s = skipped.get(skip_idx).copied();
                        skip_idx += usize::from(s.is_some());
                        s
                    });
                    match next {
                        Some(i) => chosen = i,
                        None => break,
                    }
                }
            }
            if best.is_none_or(|b| arena[chosen].score > arena[b].score) {
                best = Some(chosen);
            }
        }
        board.populate(&mut metric);
        let selection = best.map(|b| {
            let c = arena.swap_remove(b);
            Selection { node: c.node, resources: c.fit.into_resources(tg) }
        });
        arena.clear();
        self.arena = arena;
        (selection, metric)
    }

    /// The next node (from where the last placement stopped) that is feasible and fits.
    #[allow(clippy::too_many_arguments)]
    fn next_candidate(
        &mut self,
        proposed: &mut Proposed<'a>,
        group: usize,
        tg: &TaskGroup,
        opts: SelectOptions<'_>,
        metric: &mut AllocMetric,
        board: &mut ScoreBoard<'a>,
        pulled: &mut usize,
    ) -> Option<Candidate<'a>> {
        let n = self.nodes.len();
        while *pulled < n {
            if self.offset >= n {
                self.offset = 0;
            }
            // Fisher-Yates, one position at a time.
            if self.offset >= self.shuffled {
                let j = self.rng.random_range(self.offset..n);
                self.nodes.swap(self.offset, j);
                self.shuffled = self.offset + 1;
            }
            let node = self.nodes[self.offset];
            self.offset += 1;
            *pulled += 1;
            if let Some(c) = self.evaluate(proposed, node, group, tg, opts, metric, board) {
                return Some(c);
            }
        }
        None
    }

    /// True when `node` passes the group's feasibility checks (constraints,
    /// drivers, volumes, devices, networks), resources aside.
    pub(crate) fn node_feasible(&mut self, node: &Node, group: usize, alloc_name: &str) -> bool {
        self.feasibility.check(node, group, alloc_name, &mut AllocMetric::default())
    }

    /// Tries exactly `node` (system placements, in-place updates, sticky disks).
    pub(crate) fn select_node(
        &mut self,
        proposed: &mut Proposed<'a>,
        node: &'a Node,
        group: usize,
        opts: SelectOptions<'_>,
    ) -> (Option<Selection<'a>>, AllocMetric) {
        self.prepare(proposed, group);
        let job = self.job.clone();
        let tg = &job.task_groups[group];
        let mut metric = AllocMetric::default();
        let mut board = ScoreBoard::default();
        let c = self.evaluate(proposed, node, group, tg, opts, &mut metric, &mut board);
        board.populate(&mut metric);
        (c.map(|c| Selection { node: c.node, resources: c.fit.into_resources(tg) }), metric)
    }

    #[allow(clippy::too_many_arguments)]
    fn evaluate(
        &mut self,
        proposed: &mut Proposed<'a>,
        node: &'a Node,
        group: usize,
        tg: &TaskGroup,
        opts: SelectOptions<'_>,
        metric: &mut AllocMetric,
        board: &mut ScoreBoard<'a>,
    ) -> Option<Candidate<'a>> {
        metric.nodes_evaluated += 1;
        if !self.feasibility.check(node, group, opts.alloc_name, metric) {
            return None;
        }
        if !self.csi.is_empty()
            && let Err(why) = self.csi.check(proposed.state(), node, group, opts.alloc_name)
        {
            filter_node(metric, node, &why);
            return None;
        }
        let gs = &mut self.groups[group];
        let usage = proposed.usage(node);
        let system = self.kind == StackKind::System;
        let collisions = usage.group_allocs.get(group).copied().unwrap_or(0);
        if !system && ((self.job_distinct_hosts && usage.job_allocs > 0) || (gs.distinct_hosts && collisions > 0)) {
            filter_node(metric, node, "distinct_hosts");
            return None;
        }
        let props = self.job_props.iter().flatten().chain(gs.distinct_props.iter().flatten());
        for (set, allowed) in props {
            if let Err(why) = set.satisfies(node, *allowed) {
                filter_node(metric, node, &why);
                return None;
            }
        }
        let fitted = match fit(node, usage, tg, &gs.ask, &mut self.rng) {
            Ok(f) => f,
            Err(dimension) => {
                exhausted_node(metric, node, &dimension);
                return None;
            }
        };
        let mut scores = NodeScores::default();
        scores.add(scorer::BINPACK, binpack_score(Capacity::of(node), fitted.cpu_used, fitted.memory_used));
        if !system {
            match anti_affinity_score(collisions, tg.count) {
                Some(p) => scores.add(scorer::JOB_ANTI_AFFINITY, p),
                None => scores.record(scorer::JOB_ANTI_AFFINITY, 0.0),
            }
            if opts.penalty_nodes.contains(&node.id) {
                scores.add(scorer::RESCHEDULE_PENALTY, -1.0);
            } else {
                scores.record(scorer::RESCHEDULE_PENALTY, 0.0);
            }
            if gs.affinities.is_empty() {
                scores.record(scorer::NODE_AFFINITY, 0.0);
            } else if let Some(s) = gs.affinities.score(node) {
                scores.add(scorer::NODE_AFFINITY, s);
            }
            if let Some(spreads) = gs.spreads.as_mut() {
                let s = spreads.score(node);
                if s != 0.0 {
                    scores.add(scorer::SPREAD, s);
                }
            }
        }
        let score = scores.normalized().unwrap_or(0.0);
        board.offer(score, &node.id, &scores);
        Some(Candidate { node, fit: fitted, score })
    }
}

/// `distinct_property` constraints among `constraints`, with their allowed counts.
fn distinct_props(
    proposed: &Proposed<'_>,
    job: &Job,
    constraints: &[nomad_proto::Constraint],
    group: Option<&str>,
) -> Vec<(PropertySet, u64)> {
    constraints
        .iter()
        .filter(|c| c.operand == DISTINCT_PROPERTY)
        .map(|c| {
            let allowed = if c.r_target.is_empty() { Ok(1) } else { c.r_target.parse::<u64>() };
            match allowed {
                Ok(n) => (PropertySet::new(proposed, &job.namespace, &job.id, &c.l_target, group, Default::default()), n),
                Err(e) => (PropertySet::invalid(&c.l_target, format!("failed to convert RTarget {:?} to uint64: {e}", c.r_target)), 0),
            }
        })
        .collect()
}
