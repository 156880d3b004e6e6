//! A scenario's world: the server, the returning client (`node-1`), the
//! other clients, the steps a test can take, and the invariants checked
//! after every step and at the end.

use std::collections::BTreeMap;
use std::fmt;

use nomad_proto::alloc::{ALLOC_NOT_NEEDED_DESC, ALLOC_RECONNECTED_DESC, ALLOC_RESCHEDULED_DESC};
use nomad_proto::eval::trigger;
use nomad_proto::{Allocation, ClientStatus, DesiredStatus, Evaluation, Job, NodeStatus, Timestamp};
use nomad_server::endpoints::JobRegisterOptions;
use nomad_server::scheduler::ALLOC_UPDATING_DESC;
use nomad_server::state::State;

use crate::client::{Client, short};
use crate::sim::{Check, InFlight, SEC, Sim, block, recount};

/// What happens while `node-1` is away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Nothing: the alloc keeps running.
    None,
    /// The job gets a new version (a destructive change).
    JobUpdate,
    /// The first alloc fails on the cut-off node.
    AllocFailed,
    /// The disconnect window passes before the node returns.
    Expired,
}

/// Which alloc states the client still has to send when it returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// Every alloc's state (task events kept the syncer busy while cut off).
    All,
    /// Only the allocs whose state changed while cut off.
    Changed,
}

/// The scheduler type of the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A service job: `count` allocs, replacements placed elsewhere while `node-1` is away.
    Service,
    /// A system job: one alloc per feasible node, never replaced on another node.
    System,
}

/// One disconnect scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub kind: Kind,
    /// The group's count (all on `node-1` when it goes away); 1 for a system
    /// job (one alloc per node).
    pub count: i64,
    /// The group has `max_client_disconnect` (1 h).
    pub max_disconnect: bool,
    /// A second node (`node-2`) can take replacements (a system job runs its
    /// own alloc there from the start).
    pub spare: bool,
    pub event: Event,
    pub pending: Pending,
    /// The scheduler ran the node's evals before the client came back.
    pub marked: bool,
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} job count={} max_client_disconnect={} spare_node={} event={:?} pending={:?} marked_before_return={}",
            self.kind, self.count, self.max_disconnect, self.spare, self.event, self.pending, self.marked
        )
    }
}

/// Every scenario of the exhaustive grid (the event `Expired` needs a
/// window): the 56 service scenarios (count 1 and 2), then the 28 system ones
/// (one alloc per node).
pub fn grid() -> Vec<Scenario> {
    let mut out = Vec::new();
    for (kind, count) in [(Kind::Service, 1), (Kind::Service, 2), (Kind::System, 1)] {
        for max_disconnect in [true, false] {
            for spare in [true, false] {
                for event in [Event::None, Event::JobUpdate, Event::AllocFailed, Event::Expired] {
                    if event == Event::Expired && !max_disconnect {
                        continue;
                    }
                    for pending in [Pending::All, Pending::Changed] {
                        out.push(Scenario { kind, count, max_disconnect, spare, event, pending, marked: true });
                    }
                }
            }
        }
    }
    out
}

impl Scenario {
    pub fn system(&self) -> bool {
        self.kind == Kind::System
    }

    /// The nodes the job runs on once `node-1` is back: a system job on every
    /// ready node, a service job's `count` allocs wherever they fit.
    fn nodes(&self) -> Vec<&'static str> {
        if self.spare { vec![NODE, SPARE] } else { vec![NODE] }
    }

    /// Live allocs of the job at the end.
    fn live(&self) -> i64 {
        if self.system() { self.nodes().len() as i64 } else { self.count }
    }
}

pub const NODE: &str = "node-1";
pub const SPARE: &str = "node-2";
pub const JOB: &str = "web";
const WINDOW_SECS: i64 = 3600;

/// A step of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// `node-1`'s client calls `Node.Register`.
    Register,
    /// `node-1`'s client heartbeats (`Node.UpdateStatus`).
    Heartbeat,
    /// `node-1`'s client sends its pending alloc updates (`Node.UpdateAlloc`).
    UpdateAlloc,
    /// `node-1`'s client pulls its allocs (`GetClientAllocs` + `GetAllocs`) and decides.
    Pull,
    /// Every due eval is scheduled and its plan applied, one after another.
    Schedule,
    /// The scheduler computes a plan for the oldest due eval not in flight (applied later).
    Compute,
    /// The oldest computed plan is judged and applied (re-planned if refused).
    Apply,
    /// The other clients pull and report.
    Others,
    /// `node-1`'s heartbeat deadline passes.
    Expire,
    /// `node-1`'s syncer takes its pending updates as a batch...
    SyncBegin,
    /// ...which reaches the servers now (other calls may have landed meanwhile).
    SyncEnd,
}

impl Step {
    pub fn code(self) -> char {
        match self {
            Step::Register => 'R',
            Step::Heartbeat => 'H',
            Step::UpdateAlloc => 'U',
            Step::Pull => 'G',
            Step::Schedule => 's',
            Step::Compute => 'c',
            Step::Apply => 'a',
            Step::Others => 'o',
            Step::Expire => 'x',
            Step::SyncBegin => 'b',
            Step::SyncEnd => 'e',
        }
    }
}

/// Renders steps as their one-letter codes.
pub fn codes(steps: &[Step]) -> String {
    steps.iter().map(|s| s.code()).collect()
}

pub struct World {
    pub sc: Scenario,
    pub sim: Sim,
    pub c: Client,
    pub others: Vec<Client>,
    /// The allocs `node-1` ran when it went away.
    pub originals: Vec<String>,
    pub inflight: Vec<InFlight>,
    pub log: Vec<String>,
    /// `UpdateAlloc` calls accepted since `node-1` last became unresponsive.
    accepted_since_missed: usize,
    /// Run every due eval (as if each was picked up before the next arrived)
    /// instead of the broker's one-per-job-plus-newest.
    pub every_eval: bool,
    /// A heartbeat expiry hit `node-1` again while it came back: the
    /// per-alloc expectations of a single disconnect no longer apply.
    pub flapped: bool,
}

impl World {
    /// Builds the scenario up to the moment `node-1`'s client comes back.
    pub fn prefix(sc: Scenario) -> Result<World, String> {
        let sim = Sim::new(Timestamp::from_unix_nanos(1_700_000_000 * SEC));
        let mut w = World {
            sc,
            sim,
            c: Client::new(nomad_server::testing::node(NODE)),
            others: Vec::new(),
            originals: Vec::new(),
            inflight: Vec::new(),
            log: Vec::new(),
            accepted_since_missed: 0,
            every_eval: false,
            flapped: false,
        };
        w.note("setup".into());
        w.c.register(&w.sim);
        w.c.heartbeat(&w.sim);
        w.register_job(0)?;
        w.schedule()?;
        let now = w.sim.now();
        w.c.pull(&w.sim, now);
        w.c.sync(&w.sim)?;
        w.schedule()?;
        w.originals = w.c.allocs.keys().cloned().collect();
        if w.originals.len() as i64 != sc.count {
            return Err(format!("setup placed {} allocs on {NODE}, wanted {}", w.originals.len(), sc.count));
        }
        if sc.spare {
            let mut other = Client::new(nomad_server::testing::node(SPARE));
            other.register(&w.sim);
            other.heartbeat(&w.sim);
            w.sim.leader()?;
            w.others.push(other);
        }
        w.schedule()?;

        // The network goes: the heartbeat deadline passes.
        let status = w.sim.heartbeat_missed(NODE)?;
        let want = if sc.max_disconnect { NodeStatus::Disconnected } else { NodeStatus::Down };
        if status != want {
            return Err(format!("heartbeat expiry made {NODE} {status}, wanted {want}"));
        }
        w.accepted_since_missed = 0;
        w.note(format!("{NODE} missed its heartbeat → {status}"));
        if sc.marked {
            w.schedule()?;
            w.check_while_away()?;
        }
        let now = w.sim.now();
        match sc.event {
            Event::None => {}
            Event::JobUpdate => {
                w.register_job(1)?;
                w.note("job updated to version 1".into());
                if sc.marked {
                    w.schedule()?;
                }
            }
            Event::AllocFailed => {
                let first = w.originals[0].clone();
                w.c.set_status(&first, ClientStatus::Failed, now);
                w.note(format!("{} failed on {NODE}", short(&first)));
            }
            Event::Expired => {
                w.sim.advance((WINDOW_SECS + 1) * SEC);
                w.note("the disconnect window passed".into());
                w.schedule()?;
                // The next expiry check finds nothing left to wait for.
                let status = w.sim.heartbeat_missed(NODE)?;
                if status != NodeStatus::Down {
                    return Err(format!("after the window {NODE} is {status}, wanted down"));
                }
                w.schedule()?;
            }
        }
        if sc.max_disconnect && sc.event != Event::Expired {
            // The leader re-checks a disconnected node every TTL.
            let status = w.sim.heartbeat_missed(NODE)?;
            if status != NodeStatus::Disconnected {
                return Err(format!("a re-check made {NODE} {status}, wanted disconnected"));
            }
            if sc.marked {
                w.schedule()?;
            }
        }
        if sc.pending == Pending::All {
            // Task events kept the syncer busy while cut off: every state is pending.
            for id in w.originals.clone() {
                if !w.c.pending.contains_key(&id) {
                    let status = w.c.allocs[&id].status;
                    w.c.set_status(&id, status, now);
                }
            }
        }
        w.note(format!("{NODE} comes back; pending updates: {}", w.c.pending.len()));
        Ok(w)
    }

    /// An independent copy to run one ordering on.
    pub fn fork(&self) -> World {
        World {
            sc: self.sc,
            sim: self.sim.fork(),
            c: self.c.clone(),
            others: self.others.clone(),
            originals: self.originals.clone(),
            inflight: self.inflight.clone(),
            log: self.log.clone(),
            accepted_since_missed: self.accepted_since_missed,
            every_eval: self.every_eval,
            flapped: self.flapped,
        }
    }

    fn register_job(&mut self, version: u32) -> Check {
        let mut job: Job = nomad_server::testing::job(JOB, self.sc.count);
        if self.sc.system() {
            job.job_type = nomad_proto::JobType::System;
        }
        let tg = &mut job.task_groups[0];
        tg.tasks[0].resources.cpu = 100;
        tg.tasks[0].resources.memory_mb = 64;
        if self.sc.max_disconnect {
            tg.max_client_disconnect = Some(WINDOW_SECS * SEC);
        }
        tg.tasks[0].env.insert("VERSION".into(), version.to_string());
        block(self.sim.ep.job_register(job, JobRegisterOptions::default())).map_err(|e| e.to_string())?;
        self.sim.leader()
    }

    pub fn note(&mut self, s: String) {
        self.log.push(s);
    }

    pub fn job(&self) -> std::sync::Arc<Job> {
        self.sim.state().job("default", JOB).cloned().expect("job")
    }

    /// Runs the due evals as the broker hands them to an idle worker: the
    /// oldest first; when it is acked, the newest eval of the job waiting
    /// behind it runs and the older waiting ones are canceled as superseded.
    /// The other clients act after each eval.
    pub fn schedule(&mut self) -> Check {
        let mut first = true;
        for _ in 0..60 {
            let due = self.runnable();
            let pick = if first || self.every_eval {
                due.first().cloned()
            } else {
                due.iter().max_by_key(|e| (e.priority, e.modify_index)).cloned()
            };
            let Some(eval) = pick else { return Ok(()) };
            if !first && !self.every_eval {
                let superseded: Vec<Evaluation> = due
                    .into_iter()
                    .filter(|e| e.id != eval.id && e.job_id == eval.job_id)
                    .map(|mut e| {
                        e.status = nomad_proto::EvalStatus::Canceled;
                        e.status_description = nomad_server::broker::CANCELED_SUPERSEDED.to_string();
                        e
                    })
                    .collect();
                if !superseded.is_empty() {
                    self.sim.apply(nomad_server::fsm::Command::EvalUpsert { evals: superseded })?;
                }
            }
            first = false;
            let run = self.sim.compute(&eval, 0);
            let r = self.sim.finish(run);
            let committed = std::mem::take(&mut self.sim.committed).join(" | ");
            self.note(format!("  schedule {} ({}): {committed}", short(&eval.id), eval.triggered_by));
            r?;
            self.others_act()?;
        }
        Err("the scheduler did not run out of evals".into())
    }

    /// Due evals a worker may take: the broker keeps one eval per job in flight.
    fn runnable(&self) -> Vec<Evaluation> {
        self.sim.due_evals().into_iter().filter(|e| !self.inflight.iter().any(|f| f.eval.job_id == e.job_id)).collect()
    }

    fn next_due(&self) -> Option<Evaluation> {
        self.runnable().into_iter().next()
    }

    pub fn others_act(&mut self) -> Check {
        let now = self.sim.now();
        for o in &mut self.others {
            o.pull(&self.sim, now);
            o.sync(&self.sim)?;
        }
        self.sim.leader()
    }

    /// Takes one step and checks every invariant after it.
    pub fn step(&mut self, step: Step) -> Check {
        let before = self.sim.state();
        let before_status = node_status(&before);
        let now = self.sim.now();
        let what = match step {
            Step::Register => self.c.register(&self.sim),
            Step::Heartbeat => self.c.heartbeat(&self.sim),
            Step::SyncBegin => self.c.sync_begin(),
            Step::UpdateAlloc | Step::SyncEnd => {
                match if step == Step::SyncEnd { self.c.sync_end(&self.sim) } else { self.c.sync(&self.sim) } {
                    Ok(s) => {
                        if s.ends_with("accepted") {
                            if before_status.is_unresponsive() {
                                return Err(format!("{s} while {NODE} is {before_status}"));
                            }
                            self.accepted_since_missed += 1;
                        }
                        s
                    }
                    Err(s) => {
                        if !before_status.is_unresponsive() {
                            return Err(format!("{s}, but {NODE} is {before_status}"));
                        }
                        let want = format!("node {NODE} is not allowed to update allocs while in status {before_status}");
                        if !s.ends_with(&want) {
                            return Err(format!("{s}: wanted Nomad's message {want:?}"));
                        }
                        if self.sim.state().index != before.index {
                            return Err(format!("{s}, yet the state changed"));
                        }
                        s
                    }
                }
            }
            Step::Pull => self.c.pull(&self.sim, now),
            Step::Schedule => {
                self.schedule()?;
                "schedule".into()
            }
            Step::Compute => match self.next_due() {
                Some(eval) => {
                    let run = self.sim.compute(&eval, 0);
                    self.inflight.push(run);
                    format!("compute {} ({})", short(&eval.id), eval.triggered_by)
                }
                None => "compute → nothing due".into(),
            },
            Step::Apply => {
                if self.inflight.is_empty() {
                    "apply → nothing computed".into()
                } else {
                    let run = self.inflight.remove(0);
                    let id = run.eval.id.clone();
                    let r = self.sim.finish(run);
                    let committed = std::mem::take(&mut self.sim.committed).join(" | ");
                    if let Err(e) = r {
                        self.note(format!("a apply {}: {committed}", short(&id)));
                        return Err(e);
                    }
                    self.others_act()?;
                    format!("apply {}: {committed}", short(&id))
                }
            }
            Step::Others => {
                self.others_act()?;
                "others".into()
            }
            Step::Expire => {
                if before_status == NodeStatus::Down {
                    "expire → already down".into()
                } else {
                    let s = self.sim.heartbeat_missed(NODE)?;
                    self.flapped = true;
                    format!("expire → {s}")
                }
            }
        };
        self.sim.leader()?;
        let after = self.sim.state();
        let after_status = node_status(&after);
        if after_status.is_unresponsive() && !before_status.is_unresponsive() {
            self.accepted_since_missed = 0;
        }
        self.note(format!("{} {what}   [{NODE} {after_status}]", step.code()));
        self.check_step(step, &before, &after)
    }

    /// Invariants after every step.
    fn check_step(&self, step: Step, before: &State, after: &State) -> Check {
        let (was, is) = (node_status(before), node_status(after));
        match step {
            Step::Register if was != is => return Err(format!("Node.Register changed {NODE} from {was} to {is}")),
            Step::Heartbeat if was == NodeStatus::Disconnected && is != NodeStatus::Initializing => {
                return Err(format!("a heartbeat moved {NODE} from disconnected to {is}, not initializing"));
            }
            Step::Heartbeat if was == NodeStatus::Down && !matches!(is, NodeStatus::Ready | NodeStatus::Initializing) => {
                return Err(format!("a heartbeat moved {NODE} from down to {is}"));
            }
            _ => {}
        }
        if is == NodeStatus::Ready && was != NodeStatus::Ready {
            // Nomad's gate (init → ready); a down node comes straight back when none of its
            // allocs is unknown.
            let live = after.allocs_by_node(NODE).filter(|a| !a.terminal()).count();
            if was == NodeStatus::Initializing && live > 0 && self.accepted_since_missed == 0 {
                return Err(format!("{NODE} became ready with {live} live allocs before any alloc update of its landed"));
            }
            if let Some(a) = after.allocs_by_node(NODE).find(|a| !a.terminal() && a.client_status == ClientStatus::Unknown) {
                return Err(format!("{NODE} became ready while its alloc {} ({}) is still unknown", short(&a.id), a.name));
            }
        }
        if is == NodeStatus::Ready && after.node(NODE).unwrap().last_missed_heartbeat_index != 0 {
            return Err(format!("{NODE} is ready with LastMissedHeartbeatIndex {}", after.node(NODE).unwrap().last_missed_heartbeat_index));
        }
        check_summary(after)?;
        if self.sc.system() {
            // A system job's allocs never leave their node: at no point two live
            // copies of a name on one node (an `unknown` one counts), and no alloc
            // follows one on another node.
            check_copies(after, true, |a| a.desired_status == DesiredStatus::Run && !a.client_terminal(), "")?;
            for a in after.allocs_by_job("default", JOB).filter(|a| !a.previous_allocation.is_empty()) {
                let prev = after.alloc(&a.previous_allocation).map(|p| p.node_id.clone()).unwrap_or_default();
                if prev != a.node_id {
                    return Err(format!(
                        "{} ({}) on {} replaces {} of {prev}: a system alloc moved nodes",
                        a.name,
                        short(&a.id),
                        a.node_id,
                        short(&a.previous_allocation)
                    ));
                }
            }
        } else if is == NodeStatus::Ready && self.inflight.is_empty() && self.sim.due_evals().is_empty() {
            // Once the node is back and the scheduler has caught up, one copy per name.
            let running = |a: &Allocation| {
                a.desired_status == DesiredStatus::Run && matches!(a.client_status, ClientStatus::Running | ClientStatus::Pending)
            };
            check_copies(after, false, running, &format!("{NODE} is ready and nothing is due, yet "))?;
        }
        Ok(())
    }

    /// While `node-1` is away: its running allocs are `unknown` (with a
    /// window) or lost and stopped (without), and each has a replacement when
    /// there is room (a service job; a system job's never has one, and gets
    /// no `max-disconnect-timeout` eval either: the node's re-check turns it
    /// `down` once the window passed).
    fn check_while_away(&self) -> Check {
        let s = self.sim.state();
        for id in &self.originals {
            let a = s.alloc(id).unwrap();
            if self.sc.max_disconnect {
                if a.client_status != ClientStatus::Unknown || a.desired_status != DesiredStatus::Run || !a.needs_to_reconnect() {
                    return Err(format!("while away {} is {}/{}, wanted unknown/run", a.name, a.client_status, a.desired_status.as_str()));
                }
            } else if a.client_status != ClientStatus::Lost || a.desired_status != DesiredStatus::Stop {
                return Err(format!("while away {} is {}/{}, wanted lost/stop", a.name, a.client_status, a.desired_status.as_str()));
            }
            let replacements = s.allocs_by_job("default", JOB).filter(|r| r.previous_allocation == *id).count();
            let want = usize::from(self.sc.spare && !self.sc.system());
            if replacements != want {
                return Err(format!("while away {} has {replacements} replacements, wanted {want}", a.name));
            }
        }
        let timeout = s.evals().any(|e| e.triggered_by == trigger::MAX_DISCONNECT_TIMEOUT && !e.wait_until.is_zero());
        if self.sc.system() {
            if timeout {
                return Err("a max-disconnect-timeout eval for a system job (Nomad creates none)".into());
            }
            // The spare node keeps running its own alloc.
            let on_spare: Vec<&Allocation> = s.allocs_by_node(SPARE).map(|a| a.as_ref()).filter(|a| !a.terminal()).collect();
            let want = usize::from(self.sc.spare);
            if on_spare.len() != want || on_spare.iter().any(|a| a.client_status != ClientStatus::Running) {
                let got: Vec<String> = on_spare.iter().map(|a| format!("{} {}", short(&a.id), a.client_status)).collect();
                return Err(format!("while away {SPARE} runs {got:?}, wanted {want} running alloc(s)"));
            }
        } else if self.sc.max_disconnect && !timeout {
            return Err("no max-disconnect-timeout follow-up eval while away".into());
        }
        Ok(())
    }

    /// The client's normal loops after its first calls: heartbeat, pull and
    /// sync every round, the scheduler in between, until nothing moves.
    pub fn settle(&mut self) -> Check {
        while !self.inflight.is_empty() {
            self.step(Step::Apply)?;
        }
        for _ in 0..12 {
            for step in [Step::Heartbeat, Step::Pull, Step::UpdateAlloc, Step::Schedule] {
                self.step(step)?;
            }
            if self.quiet() {
                // One more pull must find nothing to do either.
                self.step(Step::Pull)?;
                if !self.c.pending.is_empty() {
                    continue;
                }
                // A failure rescheduled with a delay: wait for it.
                let live = self.sim.state().allocs_by_job("default", JOB).filter(|a| !a.terminal()).count() as i64;
                let next = self
                    .sim
                    .delayed_evals()
                    .into_iter()
                    .filter(|e| e.triggered_by != trigger::MAX_DISCONNECT_TIMEOUT)
                    .map(|e| e.wait_until)
                    .min();
                match next {
                    Some(at) if live < self.sc.live() => {
                        self.sim.advance(at.unix_nanos() - self.sim.now().unix_nanos());
                        self.note(format!("-- clock moves to {} (a delayed eval) --", at.to_rfc3339()));
                    }
                    _ => return Ok(()),
                }
            }
        }
        Err(format!("no convergence: {NODE} is {} after 12 rounds of heartbeat/pull/sync/schedule", node_status(&self.sim.state())))
    }

    /// `node-1` is ready, nothing is due or waiting to be sent.
    fn quiet(&self) -> bool {
        node_status(&self.sim.state()) == NodeStatus::Ready
            && self.c.pending.is_empty()
            && self.c.in_flight.is_none()
            && self.others.iter().all(|o| o.pending.is_empty())
            && self.inflight.is_empty()
            && self.sim.due_evals().is_empty()
    }

    /// The end state, after `settle`.
    pub fn check_end(&mut self) -> Check {
        if self.failed_system_alloc_awaits_an_eval() {
            // Nomad creates no eval for a failed system alloc (system groups have no
            // reschedule policy): it is followed at the job's next evaluation. Only an
            // alloc the servers never marked `unknown` gets here (an `unknown` one's
            // update creates a `reconnect` eval), when its failure landed after the
            // node's last eval. That next evaluation must place it on `node-1`.
            let eval = Evaluation::for_job(&self.job(), trigger::NODE_UPDATE, self.sim.now());
            self.sim.apply(nomad_server::fsm::Command::EvalUpsert { evals: vec![eval] })?;
            self.note("-- the job's next evaluation (the failed system alloc waited for one) --".into());
            self.settle()?;
        }
        let s = self.sim.state();
        let node = s.node(NODE).unwrap();
        if node.status != NodeStatus::Ready || node.last_missed_heartbeat_index != 0 {
            return Err(format!("{NODE} ends {} with LastMissedHeartbeatIndex {}", node.status, node.last_missed_heartbeat_index));
        }
        let job = self.job();
        let live: Vec<&Allocation> = s.allocs_by_job("default", JOB).map(|a| a.as_ref()).filter(|a| !a.terminal()).collect();
        if let Some(a) = live.iter().find(|a| a.client_status != ClientStatus::Running) {
            return Err(format!("{} ({}) ends {}", a.name, short(&a.id), a.client_status));
        }
        if self.sc.system() {
            // Exactly one running alloc on each ready node (all are feasible).
            let mut have: Vec<String> = live.iter().map(|a| format!("{} on {}", a.name, a.node_id)).collect();
            have.sort();
            let want: Vec<String> = self.sc.nodes().iter().map(|n| format!("{JOB}.web[0] on {n}")).collect();
            if have != want {
                return Err(format!("the system job ends with running allocs {have:?}, wanted {want:?}"));
            }
        } else {
            let mut names: Vec<&str> = live.iter().map(|a| a.name.as_str()).collect();
            names.sort();
            let want: Vec<String> = (0..self.sc.count).map(|i| format!("{JOB}.web[{i}]")).collect();
            if names != want {
                return Err(format!("the job ends with running allocs {names:?}, wanted {want:?}"));
            }
        }
        if let Some(a) = live.iter().find(|a| a.job.as_ref().is_some_and(|j| j.version != job.version)) {
            return Err(format!("{} runs job version {} of {}", a.name, a.job.as_ref().unwrap().version, job.version));
        }
        if let Some(a) = s.allocs_by_job("default", JOB).find(|a| a.client_status == ClientStatus::Unknown) {
            return Err(format!("{} ({}) is stuck unknown", a.name, short(&a.id)));
        }
        // The client runs exactly what the servers want on its node.
        let mut client_runs: Vec<&str> = self.c.running().iter().map(|l| l.server.id.as_str()).collect();
        let mut server_wants: Vec<&str> = live.iter().filter(|a| a.node_id == NODE).map(|a| a.id.as_str()).collect();
        client_runs.sort();
        server_wants.sort();
        if client_runs != server_wants {
            return Err(format!("{NODE} runs {client_runs:?}, the servers want {server_wants:?}"));
        }
        if !self.flapped {
            if self.sc.system() {
                self.check_system_originals(&s)?;
            } else {
                self.check_originals(&s)?;
            }
        }
        self.check_converged()
    }

    /// The §3 rules for what became of each alloc `node-1` ran.
    fn check_originals(&self, s: &State) -> Check {
        let job = self.job();
        for (i, id) in self.originals.iter().enumerate() {
            let o = s.alloc(id).unwrap();
            let failed = self.sc.event == Event::AllocFailed && i == 0;
            let tag = format!("{} ({})", o.name, short(id));
            if !self.sc.max_disconnect || self.sc.event == Event::Expired {
                let want = if failed { ClientStatus::Failed } else { ClientStatus::Complete };
                if o.desired_status != DesiredStatus::Stop || o.client_status != want {
                    return Err(format!("lost original {tag} ends {}/{}, wanted stop/{want}", o.desired_status.as_str(), o.client_status));
                }
                continue;
            }
            if failed {
                if o.desired_status != DesiredStatus::Stop
                    || o.client_status != ClientStatus::Failed
                    || o.desired_description != ALLOC_RESCHEDULED_DESC
                {
                    return Err(format!(
                        "failed original {tag} ends {}/{} {:?}",
                        o.desired_status.as_str(),
                        o.client_status,
                        o.desired_description
                    ));
                }
                continue;
            }
            let was_unknown = o.alloc_states.iter().any(|st| st.value == "unknown");
            if self.sc.event == Event::JobUpdate {
                // Reconnected allocs of an older version are not needed; one never marked
                // unknown is replaced by the ordinary destructive update.
                let want = if was_unknown { ALLOC_NOT_NEEDED_DESC } else { ALLOC_UPDATING_DESC };
                if o.desired_status != DesiredStatus::Stop || o.desired_description != want {
                    return Err(format!(
                        "old-version original {tag} ends {}/{} {:?}",
                        o.desired_status.as_str(),
                        o.client_status,
                        o.desired_description
                    ));
                }
                continue;
            }
            let replacement = s.allocs_by_job("default", JOB).find(|r| r.previous_allocation == *id).map(|r| r.as_ref());
            let kept = o.desired_status == DesiredStatus::Run;
            if kept {
                let states: Vec<&str> = o.alloc_states.iter().map(|st| st.value.as_str()).collect();
                let n = states.len();
                if was_unknown && (n < 2 || states[n - 1] != "running" || states[n - 2] != "unknown") {
                    return Err(format!("kept original {tag} has AllocStates {states:?}, wanted …, unknown, running"));
                }
                if let Some(r) = replacement {
                    if newer(r, o) {
                        return Err(format!("original {tag} kept over newer replacement {}", short(&r.id)));
                    }
                    if r.desired_status != DesiredStatus::Stop || r.desired_description != ALLOC_RECONNECTED_DESC {
                        return Err(format!(
                            "replacement {} of kept {tag} ends {}/{:?}",
                            short(&r.id),
                            r.desired_status.as_str(),
                            r.desired_description
                        ));
                    }
                }
            } else {
                let Some(r) = replacement.filter(|r| r.desired_status == DesiredStatus::Run) else {
                    return Err(format!("original {tag} was stopped ({:?}) without a running replacement", o.desired_description));
                };
                if !(newer(r, o) || better_scored(r, o)) {
                    return Err(format!("replacement {} kept over original {tag} without being newer or better scored", short(&r.id)));
                }
                if o.desired_description != ALLOC_NOT_NEEDED_DESC {
                    return Err(format!("original {tag} stopped with {:?}", o.desired_description));
                }
            }
        }
        let _ = job;
        Ok(())
    }

    /// A system job's alloc failed on `node-1` without ever being `unknown`, nothing
    /// followed it, and no eval of the job is waiting: Nomad's rule leaves it so.
    fn failed_system_alloc_awaits_an_eval(&self) -> bool {
        let s = self.sim.state();
        let [id] = self.originals.as_slice() else { return false };
        let Some(o) = s.alloc(id) else { return false };
        self.sc.system()
            && self.sc.event == Event::AllocFailed
            && o.desired_status == DesiredStatus::Run
            && o.client_status == ClientStatus::Failed
            && !o.alloc_states.iter().any(|st| st.value == "unknown")
            && !s.allocs_by_job("default", JOB).any(|a| a.previous_allocation == *id)
            && !s.allocs_by_node(NODE).any(|a| a.job_id == JOB && !a.terminal())
            && !s
                .evals()
                .any(|e| e.job_id == JOB && matches!(e.status, nomad_proto::EvalStatus::Pending | nomad_proto::EvalStatus::Blocked))
    }

    /// What became of the alloc `node-1` ran, for a system job (Nomad's
    /// `diffSystemAllocsForNode`): kept with a `running` AllocState after its
    /// `unknown` one when it reconnects; otherwise (lost, failed, or
    /// reconnected under an older job version) it is followed by a new alloc
    /// on `node-1` itself, never on another node.
    fn check_system_originals(&self, s: &State) -> Check {
        let [id] = self.originals.as_slice() else {
            return Err(format!("a system job ran {} allocs on {NODE}, wanted one", self.originals.len()));
        };
        let o = s.alloc(id).unwrap();
        let tag = format!("{} ({})", o.name, short(id));
        let failed = self.sc.event == Event::AllocFailed;
        let states: Vec<&str> = o.alloc_states.iter().map(|st| st.value.as_str()).collect();
        let successors: Vec<&Allocation> =
            s.allocs_by_job("default", JOB).map(|a| a.as_ref()).filter(|a| a.previous_allocation == *id).collect();
        let lost = !self.sc.max_disconnect || self.sc.event == Event::Expired;
        let (want_desired, want_client, want_desc) = if lost {
            // Stopped as lost while away; the client then reports what it did with it.
            let client = if failed { ClientStatus::Failed } else { ClientStatus::Complete };
            (DesiredStatus::Stop, client, Some(nomad_proto::alloc::ALLOC_LOST_DESC))
        } else if failed {
            // A failed system alloc is not stopped: the next eval places a new one on its node.
            (DesiredStatus::Run, ClientStatus::Failed, None)
        } else if self.sc.event == Event::JobUpdate {
            // Reconnected, then replaced in place on its node by the new version.
            (DesiredStatus::Stop, ClientStatus::Complete, Some(ALLOC_UPDATING_DESC))
        } else {
            (DesiredStatus::Run, ClientStatus::Running, None)
        };
        if o.desired_status != want_desired || o.client_status != want_client || want_desc.is_some_and(|d| o.desired_description != d) {
            return Err(format!(
                "system original {tag} ends {}/{} {:?}, wanted {}/{want_client} {want_desc:?}",
                o.desired_status.as_str(),
                o.client_status,
                o.desired_description,
                want_desired.as_str()
            ));
        }
        // Marked `unknown` while away (unless the client was back before the scheduler saw it go).
        let was_unknown = states.contains(&"unknown");
        if self.sc.max_disconnect && self.sc.marked && !was_unknown {
            return Err(format!("system original {tag} has AllocStates {states:?}, wanted an unknown one"));
        }
        if want_desired == DesiredStatus::Run && want_client == ClientStatus::Running {
            let n = states.len();
            if was_unknown && (n < 2 || states[n - 1] != "running" || states[n - 2] != "unknown") {
                return Err(format!("kept system original {tag} has AllocStates {states:?}, wanted …, unknown, running"));
            }
            if !successors.is_empty() {
                return Err(format!("kept system original {tag} has {} successors", successors.len()));
            }
            return Ok(());
        }
        // Not kept: exactly one successor, on node-1, running.
        match successors.as_slice() {
            [r] if r.node_id == NODE && r.desired_status == DesiredStatus::Run && r.client_status == ClientStatus::Running => Ok(()),
            _ => {
                let got: Vec<String> = successors
                    .iter()
                    .map(|r| format!("{} on {} {}/{}", short(&r.id), r.node_id, r.desired_status.as_str(), r.client_status))
                    .collect();
                Err(format!("system original {tag} is followed by {got:?}, wanted one running alloc on {NODE}"))
            }
        }
    }

    /// Nothing changes any more: delayed follow-ups (the disconnect timeout
    /// left over from the disconnect) and a fresh eval leave every alloc as it is.
    fn check_converged(&mut self) -> Check {
        let before = digest(&self.sim.state());
        self.sim.advance(2 * WINDOW_SECS * SEC);
        self.note("-- two hours later --".into());
        // The delayed follow-ups are due now (e.g. the disconnect timeout, GH-12809).
        self.step(Step::Schedule)?;
        let after = digest(&self.sim.state());
        if before != after {
            return Err(format!("later evals changed allocs:\n  before {before:?}\n  after  {after:?}"));
        }
        let s = self.sim.state();
        let eval = Evaluation::for_job(s.job("default", JOB).unwrap(), trigger::NODE_UPDATE, self.sim.now());
        let out = nomad_server::scheduler::Scheduler::compute(&nomad_server::scheduler::BuiltinScheduler, &s, &eval, self.sim.now());
        if !out.plan.is_no_op() {
            return Err(format!("a further scheduler run still plans changes: {:?}", plan_summary(&out.plan)));
        }
        Ok(())
    }

    /// The step log, for failure messages.
    pub fn trace(&self) -> String {
        self.log.join("\n    ")
    }
}

/// At most one alloc that `live` selects per name (per node and name when `per_node`).
fn check_copies(s: &State, per_node: bool, live: impl Fn(&Allocation) -> bool, context: &str) -> Check {
    let mut copies: BTreeMap<(&str, &str), Vec<&Allocation>> = BTreeMap::new();
    for a in s.allocs_by_job("default", JOB).map(|a| a.as_ref()).filter(|a| live(a)) {
        let node = if per_node { a.node_id.as_str() } else { "" };
        copies.entry((node, a.name.as_str())).or_default().push(a);
    }
    if let Some(((node, name), v)) = copies.iter().find(|(_, v)| v.len() > 1) {
        let who: Vec<String> = v.iter().map(|a| format!("{} on {} ({})", short(&a.id), a.node_id, a.client_status)).collect();
        let place = if per_node { format!(" on {node}") } else { String::new() };
        return Err(format!("{context}{name} runs {} times{place}: {}", v.len(), who.join(", ")));
    }
    Ok(())
}

fn node_status(s: &State) -> NodeStatus {
    s.node(NODE).map(|n| n.status).unwrap_or_default()
}

/// The job summary agrees with the allocs (unknown counted as unknown).
fn check_summary(s: &State) -> Check {
    let Some(summary) = s.job_summary("default", JOB) else { return Ok(()) };
    let g = summary.summary.get("web").cloned().unwrap_or_default();
    let counts = recount(s, JOB);
    let get = |c: ClientStatus| counts.get(&c).copied().unwrap_or(0);
    let have = [g.starting, g.running, g.complete, g.failed, g.lost, g.unknown];
    let want = [
        get(ClientStatus::Pending),
        get(ClientStatus::Running),
        get(ClientStatus::Complete),
        get(ClientStatus::Failed),
        get(ClientStatus::Lost),
        get(ClientStatus::Unknown),
    ];
    if have != want {
        return Err(format!("job summary [starting running complete failed lost unknown] = {have:?}, allocs say {want:?}"));
    }
    Ok(())
}

fn newer(r: &Allocation, o: &Allocation) -> bool {
    let key = |a: &Allocation| a.job.as_ref().map(|j| (j.version, j.create_index)).unwrap_or_default();
    let (rv, rc) = key(r);
    let (ov, oc) = key(o);
    rv > ov || rc > oc
}

fn better_scored(r: &Allocation, o: &Allocation) -> bool {
    let score = |a: &Allocation| a.metrics.as_ref().and_then(|m| m.max_norm_score());
    match (score(o), score(r)) {
        (None, Some(_)) => true,
        (Some(os), Some(rs)) => rs > os,
        _ => false,
    }
}

type Digest = BTreeMap<String, (String, DesiredStatus, ClientStatus, u64)>;

fn digest(s: &State) -> Digest {
    s.allocs_by_job("default", JOB)
        .map(|a| (short(&a.id).to_string(), (a.name.clone(), a.desired_status, a.client_status, a.alloc_modify_index)))
        .collect()
}

fn plan_summary(p: &nomad_proto::Plan) -> String {
    let stops: Vec<String> = p.node_update.values().flatten().map(|a| format!("stop {} {}", a.name, short(&a.id))).collect();
    let puts: Vec<String> = p.node_allocation.values().flatten().map(|a| format!("put {} {}", a.name, short(&a.id))).collect();
    format!("{stops:?} {puts:?}")
}
