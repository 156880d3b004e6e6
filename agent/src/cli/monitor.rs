//! Following an evaluation and the allocations it placed, the way `nomad job
//! run` does: blocking reads of `/v1/evaluation/<id>` (with its allocations)
//! until the eval finishes, then, for `job run`, blocking reads of
//! `/v1/evaluation/<id>/allocations` until every allocation is running
//! (service, system) or complete (batch, sysbatch), or one fails.
//!
//! Off a terminal every change is one line (`    <time>: Allocation "ab12cd34"
//! status changed: "pending" -> "running"`). On a terminal the allocation
//! phase redraws a compact table in place. The caller bounds the whole thing
//! with a timeout and Ctrl-C; neither stops the job.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::Duration;

use nomad_proto::deployment::status as deployment_status;
use nomad_proto::{AllocListStub, Allocation, ClientStatus, Deployment, DesiredStatus, EvalStatus, Evaluation, JobType};

use super::api::{Client, Query, encode_path};
use super::format::{format_time, go_duration, limit, now_nanos, table_with_header};
use super::{CmdResult, Failure, exit, tables};

/// How long one blocking read may wait on the server.
const BLOCK_WAIT: Duration = Duration::from_secs(30);
/// Pause between reads when the server did not block (its index did not move).
const POLL_PAUSE: Duration = Duration::from_secs(1);
/// How long a failed deployment's auto-revert may take to start its own deployment.
const ROLLBACK_WAIT: Duration = Duration::from_secs(5);

/// How to monitor.
#[derive(Debug, Clone)]
pub struct MonitorOptions {
    /// Characters of IDs to show.
    pub id_len: usize,
    /// After the eval, wait for its allocations to run (job run) instead of returning.
    pub wait_for_allocs: bool,
    /// Redraw a table in place (stdout is a terminal).
    pub live: bool,
}

/// What the monitor has seen of an eval, to print only changes.
#[derive(Debug, Default)]
pub struct Seen {
    status: Option<EvalStatus>,
    job: bool,
    node: bool,
    deployment: bool,
    allocs: BTreeMap<String, ClientStatus>,
}

/// The messages that describe what changed since `seen`, in Nomad's wording; updates `seen`.
pub fn changes(seen: &mut Seen, eval: &Evaluation, allocs: &[AllocListStub], len: usize) -> Vec<String> {
    let mut out = Vec::new();
    if !seen.node && !eval.node_id.is_empty() {
        seen.node = true;
        out.push(format!("Evaluation triggered by node \"{}\"", limit(&eval.node_id, len)));
    }
    if !seen.job && !eval.job_id.is_empty() {
        seen.job = true;
        out.push(format!("Evaluation triggered by job \"{}\"", eval.job_id));
    }
    if !seen.deployment && !eval.deployment_id.is_empty() {
        seen.deployment = true;
        out.push(format!("Evaluation within deployment: \"{}\"", limit(&eval.deployment_id, len)));
    }
    out.extend(alloc_changes(seen, allocs, eval.create_index, len));
    if let Some(prev) = seen.status
        && prev != eval.status
        && eval.status != EvalStatus::Pending
    {
        out.push(format!("Evaluation status changed: \"{}\" -> \"{}\"", prev.as_str(), eval.status.as_str()));
    }
    seen.status = Some(eval.status);
    out
}

/// Messages for new allocations and client-status changes; updates `seen`.
pub fn alloc_changes(seen: &mut Seen, allocs: &[AllocListStub], eval_create_index: u64, len: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut sorted: Vec<&AllocListStub> = allocs.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.id.cmp(&b.id)));
    for a in sorted {
        let id = limit(&a.id, len);
        match seen.allocs.insert(a.id.clone(), a.client_status) {
            None if a.create_index != 0 && a.create_index < eval_create_index => {
                out.push(format!("Allocation \"{id}\" modified: node \"{}\", group \"{}\"", limit(&a.node_id, len), a.task_group))
            }
            None if a.desired_status == DesiredStatus::Run => {
                out.push(format!("Allocation \"{id}\" created: node \"{}\", group \"{}\"", limit(&a.node_id, len), a.task_group))
            }
            Some(prev) if prev != a.client_status => {
                let desc = if a.client_description.is_empty() { String::new() } else { format!(" ({})", a.client_description) };
                out.push(format!("Allocation \"{id}\" status changed: \"{}\" -> \"{}\"{desc}", prev.as_str(), a.client_status.as_str()));
            }
            _ => {}
        }
    }
    out
}

/// Where the allocations of an eval stand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// The eval placed nothing that should run.
    Nothing,
    /// Still waiting: how many are where they should be, out of how many.
    Waiting {
        /// Running (or complete, for batch).
        ready: usize,
        /// All that should run.
        total: usize,
    },
    /// Every allocation is running (or complete, for batch).
    Done {
        /// How many.
        total: usize,
    },
    /// These allocations failed (or were lost, or a service alloc stopped).
    Failed(Vec<String>),
}

/// Whether a job type's allocations are meant to finish.
fn runs_to_completion(t: JobType) -> bool {
    matches!(t, JobType::Batch | JobType::Sysbatch)
}

/// Judges the allocations an eval placed (those the servers want running).
pub fn progress(job_type: JobType, allocs: &[AllocListStub]) -> Progress {
    let wanted: Vec<&AllocListStub> = allocs.iter().filter(|a| a.desired_status == DesiredStatus::Run).collect();
    if wanted.is_empty() {
        return Progress::Nothing;
    }
    let batch = runs_to_completion(job_type);
    let failed: Vec<String> = wanted
        .iter()
        .filter(|a| match a.client_status {
            ClientStatus::Failed | ClientStatus::Lost => true,
            // A service task that finished stopped running: that is a failure to run it.
            ClientStatus::Complete => !batch,
            _ => false,
        })
        .map(|a| a.id.clone())
        .collect();
    if !failed.is_empty() {
        return Progress::Failed(failed);
    }
    let target = if batch { ClientStatus::Complete } else { ClientStatus::Running };
    let ready = wanted.iter().filter(|a| a.client_status == target).count();
    if ready == wanted.len() { Progress::Done { total: ready } } else { Progress::Waiting { ready, total: wanted.len() } }
}

/// `web: running, sidecar: pending`, or `-` before the client reports.
fn task_summary(a: &AllocListStub) -> String {
    match &a.task_states {
        Some(ts) if !ts.is_empty() => ts
            .iter()
            .map(|(name, s)| {
                let state = if s.failed { "failed".to_string() } else { s.state.clone() };
                format!("{name}: {state}")
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => "-".to_string(),
    }
}

/// The live view: a status line and a table of the eval's allocations.
pub fn live_view(job_type: JobType, allocs: &[AllocListStub], len: usize) -> Vec<String> {
    let word = if runs_to_completion(job_type) { "complete" } else { "running" };
    let head = match progress(job_type, allocs) {
        Progress::Waiting { ready, total } | Progress::Done { total: ready @ total } => {
            format!("==> {}: {ready}/{total} allocations {word}", format_time(now_nanos()))
        }
        Progress::Failed(f) => format!("==> {}: {} allocation(s) failed", format_time(now_nanos()), f.len()),
        Progress::Nothing => format!("==> {}: no allocations", format_time(now_nanos())),
    };
    let mut sorted: Vec<&AllocListStub> = allocs.iter().filter(|a| a.desired_status == DesiredStatus::Run).collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.id.cmp(&b.id)));
    let rows = sorted
        .iter()
        .map(|a| {
            vec![
                limit(&a.id, len).to_string(),
                if a.node_name.is_empty() { limit(&a.node_id, len).to_string() } else { a.node_name.clone() },
                a.task_group.clone(),
                a.client_status.as_str().to_string(),
                task_summary(a),
            ]
        })
        .collect();
    let table = table_with_header(&["ID", "Node", "Task Group", "Status", "Tasks"], rows);
    std::iter::once(head).chain(table.lines().map(|l| format!("    {l}"))).collect()
}

/// How a deployment ended, for `job run`'s exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeploymentEnd {
    /// Every group healthy at its count.
    Successful,
    /// Failed; with `auto_revert` on a group, a rollback follows.
    Failed {
        /// Some group reverts.
        auto_revert: bool,
    },
    /// Cancelled (a newer version, a stop) or blocked.
    Other,
}

/// How `d` ended; `None` while it still runs (or is paused, or waits for a promotion).
pub fn deployment_end(d: &Deployment) -> Option<DeploymentEnd> {
    match d.status.as_str() {
        deployment_status::SUCCESSFUL => Some(DeploymentEnd::Successful),
        deployment_status::FAILED => Some(DeploymentEnd::Failed { auto_revert: d.task_groups.values().any(|g| g.auto_revert) }),
        deployment_status::CANCELLED | "blocked" => Some(DeploymentEnd::Other),
        _ => None,
    }
}

/// Follows evaluations and allocations, writing progress to `out`.
pub struct Monitor<'a> {
    client: &'a Client,
    opts: MonitorOptions,
    out: Box<dyn Write + Send + 'a>,
    /// Lines of the live view on screen, to redraw over.
    drawn: usize,
}

/// The tail of a write that may create an eval (`job revert`, `job scale`): nothing when it
/// made none (a periodic or parameterized job), its ID with `detach`, else it is followed.
pub async fn detach_or_follow(client: &Client, eval_id: &str, detach: bool, verbose: bool) -> CmdResult {
    if eval_id.is_empty() {
        return Ok(exit::OK);
    }
    if detach {
        println!("Evaluation ID: {}", super::format::safe(eval_id));
        return Ok(exit::OK);
    }
    follow_eval(client, eval_id, verbose, "the evaluation").await
}

/// Follows eval `eval_id` on stdout until it is done, or until Ctrl-C, which leaves `what`
/// carrying on (the tail of `job stop` and `job eval`).
pub async fn follow_eval(client: &Client, eval_id: &str, verbose: bool, what: &str) -> CmdResult {
    let opts =
        MonitorOptions { id_len: super::format::id_len(verbose), wait_for_allocs: false, live: super::format::stdout_is_live_terminal() };
    let mut monitor = Monitor::new(client, opts, Box::new(std::io::stdout()));
    tokio::select! {
        r = monitor.run(eval_id) => r,
        _ = super::interrupted() => {
            println!("\n==> Monitoring interrupted; {what} carries on");
            Ok(exit::INTERRUPTED)
        }
    }
}

impl<'a> Monitor<'a> {
    /// A monitor writing to `out`.
    pub fn new(client: &'a Client, opts: MonitorOptions, out: Box<dyn Write + Send + 'a>) -> Monitor<'a> {
        Monitor { client, opts, out, drawn: 0 }
    }

    fn write_line(&mut self, s: &str) {
        // Output errors (a closed pipe) must not abort the monitor's decisions.
        // One line per call: anything from a server in it is printed safe.
        let _ = writeln!(self.out, "{}", super::format::safe(s));
        let _ = self.out.flush();
    }

    /// `==> <time>: msg`.
    fn info(&mut self, msg: &str) {
        self.drawn = 0;
        let line = format!("==> {}: {msg}", format_time(now_nanos()));
        self.write_line(&line);
    }

    /// `    <time>: msg`.
    fn output(&mut self, msg: &str) {
        self.drawn = 0;
        let line = format!("    {}: {msg}", format_time(now_nanos()));
        self.write_line(&line);
    }

    /// Replaces the live view on screen with `lines`.
    pub fn redraw(&mut self, lines: &[String]) {
        if self.drawn > 0 {
            // Cursor to the start of the first drawn line, then clear to the end of the screen.
            let _ = write!(self.out, "\x1b[{}F\x1b[J", self.drawn);
        }
        for l in lines {
            let _ = writeln!(self.out, "{}", super::format::safe(l));
        }
        let _ = self.out.flush();
        self.drawn = lines.len();
    }

    /// Pauses when a read returned without the index moving (a server that does not block,
    /// or a blocking read that timed out), so the loop never spins.
    async fn pace(prev: u64, now: u64) {
        if now <= prev {
            tokio::time::sleep(POLL_PAUSE).await;
        }
    }

    async fn read_eval(&self, id: &str, index: u64) -> Result<(Evaluation, u64), Failure> {
        let a = self
            .client
            .get::<Evaluation>(&format!("/v1/evaluation/{}", encode_path(id)), &Query::new().blocking(index, BLOCK_WAIT))
            .await
            .map_err(|e| Failure::new(format!("Error reading evaluation: {e}")))?;
        Ok((a.value, a.index))
    }

    async fn read_allocs(&self, id: &str, index: u64) -> Result<(Vec<AllocListStub>, u64), Failure> {
        let a = self
            .client
            .get::<Vec<AllocListStub>>(
                &format!("/v1/evaluation/{}/allocations", encode_path(id)),
                &Query::new().blocking(index, BLOCK_WAIT),
            )
            .await
            .map_err(|e| Failure::new(format!("Error reading allocations: {e}")))?;
        Ok((a.value, a.index))
    }

    /// Monitors `eval_id` (and the evals it chains to). Returns 0 when done, 2 when
    /// placements or allocations failed.
    pub async fn run(&mut self, eval_id: &str) -> CmdResult {
        let len = self.opts.id_len;
        let mut eval_id = eval_id.to_string();
        loop {
            self.info(&format!("Monitoring evaluation \"{}\"", limit(&eval_id, len)));
            let mut seen = Seen::default();
            let mut eval_index = 0;
            let (eval, allocs, alloc_index) = loop {
                let (eval, index) = self.read_eval(&eval_id, eval_index).await?;
                let (allocs, alloc_index) = self.read_allocs(&eval_id, 0).await?;
                for m in changes(&mut seen, &eval, &allocs, len) {
                    self.output(&m);
                }
                if eval.status.is_terminal() {
                    break (eval, allocs, alloc_index);
                }
                Monitor::pace(eval_index, index).await;
                eval_index = index;
            };

            let short = limit(&eval.id, len).to_string();
            if !eval.failed_tg_allocs.is_empty() {
                self.info(&format!(
                    "Evaluation \"{short}\" finished with status \"{}\" but failed to place all allocations:",
                    eval.status.as_str()
                ));
                for (group, metrics) in &eval.failed_tg_allocs {
                    for l in tables::failed_group(group, metrics, "    ") {
                        self.write_line(&l);
                    }
                }
                if !eval.blocked_eval.is_empty() {
                    self.output(&format!(
                        "Evaluation \"{}\" waiting for additional capacity to place remainder",
                        limit(&eval.blocked_eval, len)
                    ));
                }
                return Ok(exit::PLACEMENT);
            }
            if eval.status == EvalStatus::Failed {
                let why = if eval.status_description.is_empty() { String::new() } else { format!(": {}", eval.status_description) };
                self.info(&format!("Evaluation \"{short}\" finished with status \"failed\"{why}"));
                return Ok(exit::PLACEMENT);
            }
            self.info(&format!("Evaluation \"{short}\" finished with status \"{}\"", eval.status.as_str()));
            if !eval.next_eval.is_empty() {
                if eval.wait > 0 {
                    self.info(&format!("Monitoring next evaluation \"{}\" in {}", limit(&eval.next_eval, len), go_duration(eval.wait)));
                    tokio::time::sleep(Duration::from_nanos(eval.wait.unsigned_abs())).await;
                }
                eval_id = eval.next_eval.clone();
                continue;
            }
            if !self.opts.wait_for_allocs || eval.status == EvalStatus::Canceled {
                return Ok(exit::OK);
            }
            if !eval.deployment_id.is_empty() {
                return self.watch_deployment(&eval).await;
            }
            return self.watch_allocs(&eval, &mut seen, allocs, alloc_index).await;
        }
    }

    async fn watch_allocs(&mut self, eval: &Evaluation, seen: &mut Seen, mut allocs: Vec<AllocListStub>, mut index: u64) -> CmdResult {
        let len = self.opts.id_len;
        let batch = runs_to_completion(eval.eval_type);
        let word = if batch { "complete" } else { "running" };
        let mut announced = false;
        loop {
            match progress(eval.eval_type, &allocs) {
                Progress::Nothing => {
                    self.info("Evaluation placed no allocations; nothing changed");
                    return Ok(exit::OK);
                }
                Progress::Done { total } => {
                    if self.opts.live {
                        self.redraw(&live_view(eval.eval_type, &allocs, len));
                    }
                    let what = if batch { "completed successfully" } else { "are running" };
                    self.info(&format!("All {total} allocation(s) of job \"{}\" {what}", eval.job_id));
                    return Ok(exit::OK);
                }
                Progress::Failed(ids) => {
                    if self.opts.live {
                        self.redraw(&live_view(eval.eval_type, &allocs, len));
                    }
                    self.report_failed(&ids).await;
                    return Ok(exit::PLACEMENT);
                }
                Progress::Waiting { ready, total } => {
                    if self.opts.live {
                        self.redraw(&live_view(eval.eval_type, &allocs, len));
                    } else if !announced {
                        self.info(&format!("Waiting for {total} allocation(s) to be {word} ({ready}/{total} {word})"));
                    }
                    announced = true;
                }
            }
            let (next, next_index) = self.read_allocs(&eval.id, index.max(1)).await?;
            if !self.opts.live {
                for m in alloc_changes(seen, &next, eval.create_index, len) {
                    self.output(&m);
                }
            }
            Monitor::pace(index, next_index).await;
            index = next_index;
            allocs = next;
        }
    }

    async fn read_deployment(&self, id: &str, index: u64) -> Result<(Deployment, u64), Failure> {
        let a = self
            .client
            .get::<Deployment>(&format!("/v1/deployment/{}", encode_path(id)), &Query::new().blocking(index, BLOCK_WAIT))
            .await
            .map_err(|e| Failure::new(format!("Error fetching deployment: {e}")))?;
        Ok((a.value, a.index))
    }

    /// Follows the deployment `eval` rolled out in until it ends, then the rollback an
    /// `auto_revert` started, as Nomad's `job run` does. 0 only when the first one succeeded.
    async fn watch_deployment(&mut self, eval: &Evaluation) -> CmdResult {
        let len = self.opts.id_len;
        self.info(&format!("Monitoring deployment \"{}\"", limit(&eval.deployment_id, len)));
        let mut id = eval.deployment_id.clone();
        let mut first = None;
        loop {
            let (d, end) = self.follow_deployment(&id).await?;
            let mark = if end == DeploymentEnd::Successful { '✓' } else { '!' };
            self.write_line(&format!("  {mark} Deployment \"{}\" {}", limit(&d.id, len), d.status));
            first.get_or_insert_with(|| end.clone());
            if end != (DeploymentEnd::Failed { auto_revert: true }) {
                break;
            }
            match self.rollback_of(&d, &eval.namespace).await {
                Some(next) => {
                    self.info(&format!("Monitoring rollback deployment \"{}\"", limit(&next, len)));
                    id = next;
                }
                None => break,
            }
        }
        Ok(if first == Some(DeploymentEnd::Successful) { exit::OK } else { exit::ERROR })
    }

    /// Shows the deployment as it changes (redrawn in place on a terminal) until it ends.
    async fn follow_deployment(&mut self, id: &str) -> Result<(Deployment, DeploymentEnd), Failure> {
        let verbose = self.opts.id_len > 8;
        let (mut index, mut shown) = (0, String::new());
        loop {
            let (d, next) = self.read_deployment(id, index).await?;
            let mut view = super::deployment::format_deployment(&d, verbose);
            if verbose {
                // Nomad's `-verbose` view ends with the deployment's allocations.
                view.push_str("\n\nAllocations\n");
                let path = format!("/v1/deployment/allocations/{}", encode_path(id));
                match self.client.get::<Vec<AllocListStub>>(&path, &Query::new()).await {
                    Ok(a) => view.push_str(&tables::allocs(&a.value, self.opts.id_len, true, now_nanos())),
                    Err(e) => view.push_str(&format!("Error fetching allocations: {e}")),
                }
            }
            if view != shown {
                let lines: Vec<String> = std::iter::once(format_time(now_nanos())).chain(view.lines().map(str::to_string)).collect();
                if self.opts.live {
                    self.redraw(&lines);
                } else {
                    self.write_line("");
                    for l in &lines {
                        self.write_line(l);
                    }
                }
                shown = view;
            }
            if let Some(end) = deployment_end(&d) {
                self.drawn = 0;
                return Ok((d, end));
            }
            Monitor::pace(index, next).await;
            index = next;
        }
    }

    /// The deployment an auto-revert of failed deployment `d` started, once it exists; `None`
    /// when none came within [`ROLLBACK_WAIT`] (nothing to revert to, or the same spec).
    async fn rollback_of(&self, d: &Deployment, namespace: &str) -> Option<String> {
        let deadline = tokio::time::Instant::now() + ROLLBACK_WAIT;
        let path = format!("/v1/job/{}/deployment", encode_path(&d.job_id));
        let mut index = 0;
        while tokio::time::Instant::now() < deadline {
            let q = Query::new().param("namespace", namespace).blocking(index, ROLLBACK_WAIT);
            let a = self.client.get::<Option<Deployment>>(&path, &q).await.ok()?;
            if let Some(latest) = a.value.filter(|l| l.id != d.id && l.create_index > d.create_index) {
                return Some(latest.id);
            }
            Monitor::pace(index, a.index).await;
            index = a.index;
        }
        None
    }

    /// Prints why allocations failed: each failed task's latest events.
    async fn report_failed(&mut self, ids: &[String]) {
        let len = self.opts.id_len;
        for id in ids {
            let alloc = self.client.get::<Allocation>(&format!("/v1/allocation/{}", encode_path(id)), &Query::new()).await;
            match alloc {
                Ok(a) => {
                    let a = a.value;
                    let desc = if a.client_description.is_empty() { String::new() } else { format!(" ({})", a.client_description) };
                    self.info(&format!("Allocation \"{}\" {}{desc}", limit(&a.id, len), a.client_status.as_str()));
                    for (task, state) in a.task_states.iter().flatten() {
                        if !state.failed && state.state == "running" {
                            continue;
                        }
                        let how = if state.failed { "failed" } else { state.state.as_str() };
                        self.write_line(&format!("    Task \"{task}\" is \"{how}\"; recent events:"));
                        let rows = tables::event_rows(&state.events, 3);
                        let table = table_with_header(&["Time", "Type", "Description"], rows);
                        for l in table.lines() {
                            self.write_line(&format!("      {l}"));
                        }
                    }
                }
                Err(e) => self.info(&format!("Allocation \"{}\" failed (details unavailable: {e})", limit(id, len))),
            }
            self.write_line(&format!("    See `nomad-rs alloc status {0}` and `nomad-rs alloc logs {0}`", limit(id, len)));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use nomad_proto::TaskState;

    use super::*;

    fn stub(id: &str, status: ClientStatus) -> AllocListStub {
        let a = Allocation {
            id: id.to_string(),
            name: format!("web.g[{}]", id.len()),
            node_id: "node-0001-aaaa".into(),
            task_group: "g".into(),
            client_status: status,
            create_index: 10,
            ..Allocation::default()
        };
        a.stub(nomad_proto::AllocStubFields::default())
    }

    fn eval(status: EvalStatus) -> Evaluation {
        Evaluation { id: "e1".into(), job_id: "web".into(), status, create_index: 9, ..Evaluation::default() }
    }

    #[test]
    fn only_changes_are_reported_in_nomads_words() {
        let mut seen = Seen::default();
        let first = changes(&mut seen, &eval(EvalStatus::Pending), &[], 8);
        assert_eq!(first, vec!["Evaluation triggered by job \"web\""]);
        assert!(changes(&mut seen, &eval(EvalStatus::Pending), &[], 8).is_empty(), "nothing new, nothing printed");

        let placed = [stub("aaaaaaaa-1111", ClientStatus::Pending)];
        let second = changes(&mut seen, &eval(EvalStatus::Complete), &placed, 8);
        assert_eq!(
            second,
            vec![
                "Allocation \"aaaaaaaa\" created: node \"node-000\", group \"g\"",
                "Evaluation status changed: \"pending\" -> \"complete\"",
            ]
        );
        let mut running = stub("aaaaaaaa-1111", ClientStatus::Running);
        running.client_description = "Tasks are running".into();
        assert_eq!(
            alloc_changes(&mut seen, &[running], 9, 8),
            vec!["Allocation \"aaaaaaaa\" status changed: \"pending\" -> \"running\" (Tasks are running)"]
        );
    }

    #[test]
    fn allocs_older_than_the_eval_were_modified_not_created() {
        let mut seen = Seen::default();
        let mut old = stub("bbbbbbbb", ClientStatus::Running);
        old.create_index = 3;
        assert_eq!(alloc_changes(&mut seen, &[old], 9, 8), vec!["Allocation \"bbbbbbbb\" modified: node \"node-000\", group \"g\""]);
    }

    #[test]
    fn progress_depends_on_the_job_type() {
        use ClientStatus::*;
        let s = |v: &[ClientStatus]| v.iter().enumerate().map(|(i, c)| stub(&format!("a{i}"), *c)).collect::<Vec<_>>();
        assert_eq!(progress(JobType::Service, &s(&[])), Progress::Nothing);
        assert_eq!(progress(JobType::Service, &s(&[Running, Pending])), Progress::Waiting { ready: 1, total: 2 });
        assert_eq!(progress(JobType::Service, &s(&[Running, Running])), Progress::Done { total: 2 });
        assert_eq!(progress(JobType::Service, &s(&[Running, Failed])), Progress::Failed(vec!["a1".into()]));
        assert_eq!(progress(JobType::Service, &s(&[Complete])), Progress::Failed(vec!["a0".into()]), "a service alloc must keep running");
        assert_eq!(progress(JobType::Batch, &s(&[Running, Complete])), Progress::Waiting { ready: 1, total: 2 });
        assert_eq!(progress(JobType::Batch, &s(&[Complete, Complete])), Progress::Done { total: 2 });
        assert_eq!(progress(JobType::Batch, &s(&[Lost])), Progress::Failed(vec!["a0".into()]));
        let mut stopped = s(&[Failed]);
        stopped[0].desired_status = DesiredStatus::Stop;
        assert_eq!(progress(JobType::Service, &stopped), Progress::Nothing, "allocs the servers stopped are not waited on");
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_live_view_redraws_over_itself() {
        let client = Client::new(super::super::api::ApiConfig {
            address: "http://127.0.0.1:1".into(),
            token: None,
            namespace: None,
            region: None,
            tls: Default::default(),
        })
        .unwrap();
        let buf = Buf::default();
        let mut m = Monitor::new(&client, MonitorOptions { id_len: 8, wait_for_allocs: true, live: true }, Box::new(buf.clone()));
        let mut a = stub("cccccccc-2222", ClientStatus::Pending);
        let view = live_view(JobType::Service, std::slice::from_ref(&a), 8);
        assert!(view[0].ends_with("0/1 allocations running"), "{view:?}");
        assert_eq!(view.len(), 3, "status line, header, one alloc");
        m.redraw(&view);
        a.client_status = ClientStatus::Running;
        a.task_states = Some(BTreeMap::from([("server".to_string(), TaskState { state: "running".into(), ..TaskState::default() })]));
        m.redraw(&live_view(JobType::Service, &[a], 8));
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let (first, second) = text.split_once("\x1b[3F\x1b[J").expect("the second draw moves up over the first");
        assert!(first.contains("pending") && !first.contains('\x1b'));
        assert!(second.contains("1/1 allocations running") && second.contains("server: running"), "{second}");
    }
}
