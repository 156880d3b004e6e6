//! The periodic dispatcher (Nomad's `nomad/periodic.go`): while this server leads, it launches
//! each active periodic job (enabled, not stopped, not parameterized) at its cron times, as a
//! child `<job>/periodic-<launch unix seconds>` registered with a `periodic-job` eval.
//!
//! ```text
//!  jobs table ──(change)──▶ schedule: job → next launch ──(due)──▶ prohibit_overlap? ──▶ PeriodicLaunch
//! ```
//!
//! Failover: every launch is recorded in Raft with the child. A new leader looks at each job's
//! last recorded launch; if the launch after it is already past, it runs one launch at once (a
//! missed run is made up once, not replayed), then follows the schedule. The child's ID comes
//! from its launch time and the FSM ignores a child that exists, so two leaders launching the
//! same time make one child.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nomad_proto::cron::{CivilTime, CronSchedule};
use nomad_proto::eval::trigger;
use nomad_proto::job::PeriodicConfig;
use nomad_proto::{Evaluation, Job, NamespacedId, Timestamp};

use crate::consensus::{BoxFuture, Consensus};
use crate::fsm::Command;
use crate::state::{State, StateStore, Table};

/// The suffix before a periodic child's launch time (Nomad's `PeriodicLaunchSuffix`).
pub const PERIODIC_LAUNCH_SUFFIX: &str = "/periodic-";

/// How long the dispatcher sleeps when nothing is scheduled before it looks at the jobs again.
const IDLE_WAIT: Duration = Duration::from_secs(300);

/// Most launches of one job the dispatcher makes up in one pass after falling behind.
const MAX_CATCH_UP: usize = 16;

/// The next launch of `p` strictly after `after` (Unix nanoseconds): the earliest over its
/// specs, in its time zone (UTC when unset). `Ok(None)`: no launch is left (a year past 2099).
pub fn next_launch(p: &PeriodicConfig, after: i64) -> Result<Option<i64>, String> {
    let tz = time_zone(&p.time_zone)?;
    let mut best: Option<i64> = None;
    for spec in std::iter::once(&p.spec).filter(|s| !s.is_empty()).chain(p.specs.iter()) {
        let schedule = CronSchedule::parse(spec).map_err(|e| format!("invalid cron spec {spec:?}: {e}"))?;
        if let Some(t) = next_in_zone(&schedule, &tz, after)? {
            best = Some(best.map_or(t, |b| b.min(t)));
        }
    }
    Ok(best)
}

fn time_zone(name: &str) -> Result<jiff::tz::TimeZone, String> {
    if name.is_empty() || name == "UTC" {
        return Ok(jiff::tz::TimeZone::UTC);
    }
    jiff::tz::TimeZone::get(name).map_err(|e| format!("invalid time zone {name:?}: {e}"))
}

/// Cron fields match wall-clock time in the zone; a wall time a DST change skips runs at the
/// first instant after the gap, and one it repeats runs once (the earlier instant).
fn next_in_zone(schedule: &CronSchedule, tz: &jiff::tz::TimeZone, after: i64) -> Result<Option<i64>, String> {
    let ts = jiff::Timestamp::from_nanosecond(i128::from(after)).map_err(|e| e.to_string())?;
    let local = ts.to_zoned(tz.clone()).datetime();
    let mut civil = CivilTime {
        year: i32::from(local.year()),
        month: local.month() as u8,
        day: local.day() as u8,
        hour: local.hour() as u8,
        minute: local.minute() as u8,
        second: local.second() as u8,
    };
    // A repeated wall hour can give an instant not after `after`: look further.
    for _ in 0..4 {
        let Some(next) = schedule.next_after(civil) else { return Ok(None) };
        let dt = jiff::civil::DateTime::new(
            next.year as i16,
            next.month as i8,
            next.day as i8,
            next.hour as i8,
            next.minute as i8,
            next.second as i8,
            0,
        )
        .map_err(|e| e.to_string())?;
        let zoned = tz.to_ambiguous_zoned(dt).compatible().map_err(|e| e.to_string())?;
        let nanos = i64::try_from(zoned.timestamp().as_nanosecond()).map_err(|e| e.to_string())?;
        if nanos > after {
            return Ok(Some(nanos));
        }
        civil = next;
    }
    Ok(None)
}

/// A periodic child as Nomad derives it: a copy named `<parent>/periodic-<unix>` without the
/// periodic block, and its `periodic-job` eval.
pub fn periodic_child(parent: &Job, launch: i64, now: Timestamp) -> (Job, Evaluation) {
    let mut child = parent.clone();
    child.id = format!("{}{PERIODIC_LAUNCH_SUFFIX}{}", parent.id, launch.div_euclid(1_000_000_000));
    child.name = child.id.clone();
    child.parent_id = parent.id.clone();
    child.periodic = None;
    child.status_description.clear();
    let eval = Evaluation::for_job(&child, trigger::PERIODIC_JOB, now);
    (child, eval)
}

/// Whether a periodic job has a child still at work: a live eval or an alloc the client has not
/// finished (Nomad's `RunningChildren`), which `prohibit_overlap` waits for.
pub fn has_running_children(state: &State, parent: &Job) -> bool {
    let prefix = format!("{}{PERIODIC_LAUNCH_SUFFIX}", parent.id);
    state.jobs_by_prefix(Some(&parent.namespace), &prefix).filter(|c| c.parent_id == parent.id).any(|child| {
        state.evals_by_job(&child.namespace, &child.id).any(|e| !e.status.is_terminal())
            || state.allocs_by_job(&child.namespace, &child.id).any(|a| !a.client_terminal())
    })
}

/// A job the dispatcher tracks, with its last recorded launch.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// The periodic job.
    pub job: Arc<Job>,
    /// Its last launch (Unix nanoseconds), or its registration time before the first.
    pub last_launch: Option<i64>,
}

/// What the dispatcher may read and write, and nothing else.
pub trait PeriodicJobs: Send + Sync + 'static {
    /// The active periodic jobs now, and the jobs table's index they were read at.
    fn tracked(&self) -> (Vec<Tracked>, u64);
    /// Waits (up to `wait`) for the jobs table to pass `index`.
    fn jobs_changed(&self, index: u64, wait: Duration) -> BoxFuture<'_, ()>;
    /// Whether the job has a child still at work.
    fn running_children(&self, job: &Job) -> bool;
    /// Writes one launch.
    fn launch(&self, job: &Job, launch: i64) -> BoxFuture<'_, Result<u64, String>>;
}

/// [`PeriodicJobs`] over the state store and consensus.
pub struct StorePeriodicJobs {
    /// State.
    pub store: Arc<StateStore>,
    /// Writes.
    pub consensus: Arc<dyn Consensus>,
}

impl PeriodicJobs for StorePeriodicJobs {
    fn tracked(&self) -> (Vec<Tracked>, u64) {
        let snap = self.store.snapshot();
        let tracked = snap
            .jobs()
            .filter(|j| j.is_periodic_active())
            .map(|j| Tracked { job: j.clone(), last_launch: snap.periodic_launch(&j.namespace, &j.id).map(|l| l.launch) })
            .collect();
        (tracked, snap.table_index(Table::Jobs))
    }

    fn jobs_changed(&self, index: u64, wait: Duration) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            self.store.blocking_query(&[Table::Jobs], index.max(1), wait, |s| ((), s.table_index(Table::Jobs))).await;
        })
    }

    fn running_children(&self, job: &Job) -> bool {
        has_running_children(&self.store.snapshot(), job)
    }

    fn launch(&self, job: &Job, launch: i64) -> BoxFuture<'_, Result<u64, String>> {
        let now = Timestamp::now();
        let (child, eval) = periodic_child(job, launch, now);
        let cmd = Command::PeriodicLaunch { namespace: job.namespace.clone(), job_id: job.id.clone(), launch, child, eval, now };
        Box::pin(async move { self.consensus.apply(cmd).await.map_err(|e| e.to_string()) })
    }
}

struct Scheduled {
    job: Arc<Job>,
    /// `None`: the schedule has no launch left.
    next: Option<i64>,
}

/// The dispatcher of one term of leadership.
pub struct PeriodicDispatcher {
    jobs: Arc<dyn PeriodicJobs>,
    schedule: HashMap<NamespacedId, Scheduled>,
}

impl PeriodicDispatcher {
    /// A dispatcher over `jobs`.
    pub fn new(jobs: Arc<dyn PeriodicJobs>) -> PeriodicDispatcher {
        PeriodicDispatcher { jobs, schedule: HashMap::new() }
    }

    /// Runs until dropped (leadership lost).
    pub async fn run(mut self) {
        let index = self.restore(Timestamp::now().unix_nanos()).await;
        let mut index = index;
        loop {
            self.launch_due(Timestamp::now().unix_nanos()).await;
            let wait = match self.schedule.values().filter_map(|s| s.next).min() {
                Some(next) => {
                    let ahead = next.saturating_sub(Timestamp::now().unix_nanos()).max(0);
                    Duration::from_nanos(ahead as u64).min(IDLE_WAIT)
                }
                None => IDLE_WAIT,
            };
            self.jobs.jobs_changed(index, wait).await;
            index = self.sync(Timestamp::now().unix_nanos());
        }
    }

    /// Takes over after a leadership change: schedules every active job, and launches at once
    /// those whose launch after the recorded one has passed (once each).
    pub async fn restore(&mut self, now: i64) -> u64 {
        let (tracked, index) = self.jobs.tracked();
        for t in tracked {
            let key = t.job.namespaced_id();
            let missed = t.last_launch.and_then(|last| self.next_of(&t.job, last)).is_some_and(|n| n <= now);
            if missed {
                tracing::info!(job = %t.job.id, namespace = %t.job.namespace, "periodic job missed a launch while no leader ran: launching it now");
                self.launch(&t.job, now, true).await;
            }
            let next = self.next_of(&t.job, now);
            self.schedule.insert(key, Scheduled { job: t.job, next });
        }
        index
    }

    /// Follows the jobs table: new or changed jobs are scheduled from `now`, gone ones dropped.
    pub fn sync(&mut self, now: i64) -> u64 {
        let (tracked, index) = self.jobs.tracked();
        let mut live: HashMap<NamespacedId, Arc<Job>> = tracked.into_iter().map(|t| (t.job.namespaced_id(), t.job)).collect();
        self.schedule.retain(|key, _| live.contains_key(key));
        for (key, job) in live.drain() {
            let unchanged = self.schedule.get(&key).is_some_and(|s| s.job.job_modify_index == job.job_modify_index);
            if !unchanged {
                let next = self.next_of(&job, now);
                self.schedule.insert(key, Scheduled { job, next });
            } else if let Some(s) = self.schedule.get_mut(&key) {
                s.job = job;
            }
        }
        index
    }

    /// Launches every job whose time has come, and moves it to its next time.
    pub async fn launch_due(&mut self, now: i64) {
        let due: Vec<NamespacedId> =
            self.schedule.iter().filter(|(_, s)| s.next.is_some_and(|n| n <= now)).map(|(k, _)| k.clone()).collect();
        for key in due {
            for _ in 0..MAX_CATCH_UP {
                let Some(s) = self.schedule.get(&key) else { break };
                let (job, Some(at)) = (s.job.clone(), s.next) else { break };
                if at > now {
                    break;
                }
                self.launch(&job, at, false).await;
                let next = self.next_of(&job, at);
                if let Some(s) = self.schedule.get_mut(&key) {
                    s.next = next;
                }
            }
            // Still behind after the most one pass makes up: go on from now.
            if let Some(s) = self.schedule.get_mut(&key)
                && s.next.is_some_and(|n| n <= now)
            {
                s.next = next_launch(s.job.periodic.as_ref().expect("tracked jobs are periodic"), now).ok().flatten();
            }
        }
    }

    fn next_of(&self, job: &Job, after: i64) -> Option<i64> {
        let p = job.periodic.as_ref()?;
        match next_launch(p, after) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(job = %job.id, namespace = %job.namespace, error = %e, "periodic job cannot be scheduled");
                None
            }
        }
    }

    async fn launch(&self, job: &Job, at: i64, after_failover: bool) {
        let prohibit = job.periodic.as_ref().is_some_and(|p| p.prohibit_overlap);
        if prohibit && self.jobs.running_children(job) {
            tracing::debug!(job = %job.id, namespace = %job.namespace, "skipping launch of periodic job because job prohibits overlap");
            return;
        }
        match self.jobs.launch(job, at).await {
            Ok(_) => tracing::debug!(job = %job.id, namespace = %job.namespace, launch = at, after_failover, "periodic job launched"),
            Err(e) => tracing::warn!(job = %job.id, namespace = %job.namespace, error = %e, "failed to launch periodic job"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use nomad_proto::JobType;

    use super::*;

    const SEC: i64 = 1_000_000_000;

    /// 2026-12-06T00:00:00Z.
    const T0: i64 = 1_796_515_200 * SEC;

    fn periodic(id: &str, spec: &str, prohibit_overlap: bool) -> Arc<Job> {
        Arc::new(Job {
            id: id.into(),
            namespace: "default".into(),
            job_type: JobType::Batch,
            job_modify_index: 1,
            periodic: Some(PeriodicConfig {
                enabled: true,
                spec: spec.into(),
                spec_type: "cron".into(),
                prohibit_overlap,
                ..PeriodicConfig::default()
            }),
            ..Job::default()
        })
    }

    /// Jobs with their last launches; the launches written, and whether children still run.
    #[derive(Default)]
    struct Fake {
        jobs: Mutex<Vec<Tracked>>,
        launched: Mutex<Vec<(String, i64)>>,
        running: Mutex<bool>,
    }

    impl PeriodicJobs for Fake {
        fn tracked(&self) -> (Vec<Tracked>, u64) {
            (self.jobs.lock().unwrap().clone(), 1)
        }
        fn jobs_changed(&self, _index: u64, _wait: Duration) -> BoxFuture<'_, ()> {
            Box::pin(std::future::pending())
        }
        fn running_children(&self, _job: &Job) -> bool {
            *self.running.lock().unwrap()
        }
        fn launch(&self, job: &Job, launch: i64) -> BoxFuture<'_, Result<u64, String>> {
            self.launched.lock().unwrap().push((job.id.clone(), launch));
            Box::pin(async { Ok(1) })
        }
    }

    fn fake(jobs: Vec<Tracked>) -> Arc<Fake> {
        Arc::new(Fake { jobs: Mutex::new(jobs), ..Fake::default() })
    }

    #[test]
    fn next_launches_follow_the_spec_in_the_jobs_time_zone() {
        let mut p = PeriodicConfig { spec: "0 9 * * *".into(), spec_type: "cron".into(), ..PeriodicConfig::default() };
        assert_eq!(next_launch(&p, T0).unwrap(), Some(T0 + 9 * 3600 * SEC));
        p.time_zone = "America/New_York".into();
        assert_eq!(next_launch(&p, T0).unwrap(), Some(T0 + 14 * 3600 * SEC), "09:00 EST is 14:00 UTC");
        p.time_zone = "Nowhere/Special".into();
        assert!(next_launch(&p, T0).unwrap_err().contains("invalid time zone"));
        // Several specs: the earliest wins; strictly after the given time.
        let p = PeriodicConfig { spec: "0 9 * * *".into(), specs: vec!["30 0 * * *".into()], ..PeriodicConfig::default() };
        assert_eq!(next_launch(&p, T0).unwrap(), Some(T0 + 30 * 60 * SEC));
        assert_eq!(next_launch(&p, T0 + 30 * 60 * SEC).unwrap(), Some(T0 + 9 * 3600 * SEC));
        let p = PeriodicConfig { spec: "0 0 1 1 * 2020".into(), ..PeriodicConfig::default() };
        assert_eq!(next_launch(&p, T0).unwrap(), None, "no launch left");
    }

    #[test]
    fn a_child_is_named_by_its_launch_second_and_loses_the_periodic_block() {
        let parent = periodic("report", "@daily", false);
        let (child, eval) = periodic_child(&parent, T0 + 500_000_000, Timestamp::from_unix_nanos(T0));
        assert_eq!(child.id, format!("report/periodic-{}", T0 / SEC));
        assert_eq!((child.name.as_str(), child.parent_id.as_str()), (child.id.as_str(), "report"));
        assert!(child.periodic.is_none());
        assert_eq!((eval.job_id.as_str(), eval.triggered_by.as_str()), (child.id.as_str(), "periodic-job"));
    }

    #[tokio::test]
    async fn a_new_leader_makes_up_one_missed_launch_and_no_more() {
        // Every minute; the last launch was five minutes ago: one launch now, not five.
        let missed = Tracked { job: periodic("missed", "* * * * *", false), last_launch: Some(T0 - 5 * 60 * SEC) };
        // The next launch after the recorded one is still ahead: nothing now.
        let on_time = Tracked { job: periodic("on-time", "0 * * * *", false), last_launch: Some(T0) };
        let jobs = fake(vec![missed, on_time]);
        let mut d = PeriodicDispatcher::new(jobs.clone());
        d.restore(T0 + 10 * SEC).await;
        assert_eq!(*jobs.launched.lock().unwrap(), [("missed".to_string(), T0 + 10 * SEC)]);
        // Then the schedule: the next minute for one, the next hour for the other.
        d.launch_due(T0 + 59 * SEC).await;
        assert_eq!(jobs.launched.lock().unwrap().len(), 1, "nothing is due before the minute");
        d.launch_due(T0 + 60 * SEC).await;
        assert_eq!(jobs.launched.lock().unwrap().last().unwrap(), &("missed".to_string(), T0 + 60 * SEC));
        d.launch_due(T0 + 3600 * SEC).await;
        let launched = jobs.launched.lock().unwrap().clone();
        assert!(launched.contains(&("on-time".to_string(), T0 + 3600 * SEC)), "{launched:?}");
        // Behind by an hour: the missed minutes are made up, at most MAX_CATCH_UP of them.
        let missed_minutes = launched.iter().filter(|(id, _)| id == "missed").count();
        assert_eq!(missed_minutes, 2 + MAX_CATCH_UP, "{launched:?}");
        let next = d.schedule[&NamespacedId::new("default", "missed")].next.unwrap();
        assert_eq!(next, T0 + 3660 * SEC, "after catching up, the schedule goes on from now");
    }

    #[tokio::test]
    async fn prohibit_overlap_skips_a_launch_while_a_child_runs() {
        let jobs = fake(vec![Tracked { job: periodic("p", "* * * * *", true), last_launch: Some(T0) }]);
        *jobs.running.lock().unwrap() = true;
        let mut d = PeriodicDispatcher::new(jobs.clone());
        d.restore(T0 + SEC).await;
        d.launch_due(T0 + 60 * SEC).await;
        assert!(jobs.launched.lock().unwrap().is_empty(), "skipped while a child runs");
        assert_eq!(d.schedule[&NamespacedId::new("default", "p")].next, Some(T0 + 120 * SEC), "and the schedule moves on");
        *jobs.running.lock().unwrap() = false;
        d.launch_due(T0 + 120 * SEC).await;
        assert_eq!(*jobs.launched.lock().unwrap(), [("p".to_string(), T0 + 120 * SEC)]);
    }

    #[tokio::test]
    async fn jobs_that_change_are_rescheduled_and_gone_ones_dropped() {
        let jobs = fake(vec![Tracked { job: periodic("a", "0 * * * *", false), last_launch: Some(T0) }]);
        let mut d = PeriodicDispatcher::new(jobs.clone());
        d.restore(T0 + SEC).await;
        assert_eq!(d.schedule[&NamespacedId::new("default", "a")].next, Some(T0 + 3600 * SEC));
        let mut changed = (*periodic("a", "30 * * * *", false)).clone();
        changed.job_modify_index = 2;
        *jobs.jobs.lock().unwrap() = vec![Tracked { job: Arc::new(changed), last_launch: Some(T0) }];
        d.sync(T0 + 2 * SEC);
        assert_eq!(d.schedule[&NamespacedId::new("default", "a")].next, Some(T0 + 1800 * SEC));
        jobs.jobs.lock().unwrap().clear();
        d.sync(T0 + 3 * SEC);
        assert!(d.schedule.is_empty());
    }

    /// Against the real state: a job every second launches children on time, one per second,
    /// and a second dispatcher (a new leader) neither doubles nor skips.
    #[tokio::test]
    async fn a_job_every_second_launches_and_a_new_leader_does_not_double_it() {
        let ts = crate::testing::TestServer::new();
        let mut job = (*periodic("tick", "* * * * * * *", false)).clone();
        job.task_groups = crate::testing::job("tick", 1).task_groups;
        ts.endpoints.job_register(job, Default::default()).await.unwrap();
        let handle = Arc::new(StorePeriodicJobs { store: ts.store.clone(), consensus: ts.consensus.clone() });
        let children = |store: &StateStore| -> Vec<String> {
            store.snapshot().jobs_by_prefix(Some("default"), "tick/periodic-").map(|j| j.id.clone()).collect()
        };
        let first = tokio::spawn(PeriodicDispatcher::new(handle.clone()).run());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while children(&ts.store).len() < 2 {
            assert!(tokio::time::Instant::now() < deadline, "no launches: {:?}", children(&ts.store));
            ts.store
                .blocking_query(&[Table::Jobs], ts.store.snapshot().table_index(Table::Jobs) + 1, Duration::from_millis(500), |s| {
                    ((), s.index)
                })
                .await;
        }
        first.abort();
        let _ = first.await;
        // The new leader starts at once: the last launch was under a second ago, or one is due
        // now; either way no child is made twice (IDs are by launch second).
        let second = tokio::spawn(PeriodicDispatcher::new(handle).run());
        let before = children(&ts.store).len();
        while children(&ts.store).len() < before + 2 {
            assert!(tokio::time::Instant::now() < deadline, "the new leader does not launch: {:?}", children(&ts.store));
            ts.store
                .blocking_query(&[Table::Jobs], ts.store.snapshot().table_index(Table::Jobs) + 1, Duration::from_millis(500), |s| {
                    ((), s.index)
                })
                .await;
        }
        second.abort();
        let ids = children(&ts.store);
        let mut secs: Vec<i64> = ids.iter().map(|id| id.rsplit('-').next().unwrap().parse().unwrap()).collect();
        secs.sort_unstable();
        for w in secs.windows(2) {
            assert_eq!(w[1] - w[0], 1, "one child per second, none skipped or doubled: {secs:?}");
        }
        let snap = ts.store.snapshot();
        for id in &ids {
            assert_eq!(snap.evals_by_job("default", id).count(), 1, "{id}: one eval per child");
        }
    }
}
