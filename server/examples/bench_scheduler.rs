//! Whole-path scheduling benchmark: simulated nodes in state, jobs registered
//! through the endpoints, evals through the real change watcher, broker,
//! workers and plan applier, written through LocalConsensus or a real
//! single-server Raft (openraft over redb, fsync per entry).
//!
//! ```text
//! cargo run --release -p nomad-server --example bench_scheduler -- \
//!     --nodes 10000 --allocs 100000 --per-job 100 --consensus local
//! ```
//!
//! Prints one result line; `scripts/bench-scheduler` runs a matrix.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use nomad_proto::{EvalStatus, Timestamp};
use nomad_server::consensus::{ApplyError, BoxFuture, Consensus, LocalConsensus};
use nomad_server::endpoints::{EndpointConfig, Endpoints, JobRegisterOptions};
use nomad_server::fsm::{Command, ServerFsm};
use nomad_server::heartbeat::{HeartbeatConfig, HeartbeatExpiry, Heartbeater};
use nomad_server::leader::{Leader, LeaderConfig, LeaderDeps};
use nomad_server::plan_apply::PlanApplierConfig;
use nomad_server::raft::{RaftConfig, RaftError, RaftNode};
use nomad_server::scheduler::{BuiltinScheduler, Scheduler};
use nomad_server::sim::{RandomFit, ready_node};
use nomad_server::state::{StateStore, Table};
use tokio::sync::watch;

/// The scheduler under test: the server's own built-in schedulers, unless
/// `--scheduler random-fit` asks for the simulation's stand-in (for comparing
/// the cost of the real placement logic against the rest of the path).
fn scheduler_under_test(name: &str) -> (Arc<dyn Scheduler>, &'static str) {
    match name {
        "builtin" => (Arc::new(BuiltinScheduler), "BuiltinScheduler"),
        "random-fit" => (Arc::new(RandomFit::default()), "stand-in RandomFit (not the real scheduler)"),
        other => panic!("--scheduler must be builtin or random-fit, not {other}"),
    }
}

#[derive(Debug, Clone)]
struct Args {
    nodes: usize,
    allocs: usize,
    per_job: usize,
    consensus: String,
    workers: usize,
    in_flight: usize,
    max_plans_per_entry: usize,
    pipeline: bool,
    submitters: usize,
    job_rate: f64,
    scheduler: String,
}

fn parse_args() -> Args {
    let mut a = Args {
        nodes: 10_000,
        allocs: 100_000,
        per_job: 100,
        consensus: "local".into(),
        workers: LeaderConfig::default().num_schedulers,
        in_flight: LeaderConfig::default().evals_in_flight,
        max_plans_per_entry: PlanApplierConfig::default().max_plans_per_entry,
        pipeline: true,
        submitters: 16,
        job_rate: 0.0,
        scheduler: "builtin".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--nodes" => a.nodes = value().parse().expect("--nodes"),
            "--allocs" => a.allocs = value().parse().expect("--allocs"),
            "--per-job" => a.per_job = value().parse().expect("--per-job"),
            "--consensus" => a.consensus = value(),
            "--workers" => a.workers = value().parse().expect("--workers"),
            "--in-flight" => a.in_flight = value().parse().expect("--in-flight"),
            "--max-plans-per-entry" => a.max_plans_per_entry = value().parse().expect("--max-plans-per-entry"),
            "--no-pipeline" => a.pipeline = false,
            "--submitters" => a.submitters = value().parse().expect("--submitters"),
            "--job-rate" => a.job_rate = value().parse().expect("--job-rate"),
            "--scheduler" => a.scheduler = value(),
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// Counts entries and plans per entry on the way to the real consensus.
struct Counting {
    inner: Arc<dyn Consensus>,
    entries: AtomicU64,
    plan_entries: AtomicU64,
    plans: AtomicU64,
}

impl Consensus for Counting {
    fn apply(&self, cmd: Command) -> BoxFuture<'_, Result<u64, ApplyError>> {
        self.entries.fetch_add(1, Ordering::Relaxed);
        let plans = match &cmd {
            Command::PlanApply(_) => 1,
            Command::PlanApplyBatch(v) => v.len() as u64,
            _ => 0,
        };
        if plans > 0 {
            self.plan_entries.fetch_add(1, Ordering::Relaxed);
            self.plans.fetch_add(plans, Ordering::Relaxed);
        }
        self.inner.apply(cmd)
    }
    fn is_leader(&self) -> bool {
        self.inner.is_leader()
    }
    fn leadership(&self) -> watch::Receiver<bool> {
        self.inner.leadership()
    }
    fn leader_rpc_addr(&self) -> Option<String> {
        self.inner.leader_rpc_addr()
    }
    fn peers(&self) -> Vec<String> {
        self.inner.peers()
    }
}

/// A single-server Raft behind the [`Consensus`] trait.
struct RaftConsensus {
    node: RaftNode,
    leader: watch::Sender<bool>,
}

impl RaftConsensus {
    async fn start(dir: &std::path::Path, store: Arc<StateStore>) -> RaftConsensus {
        let auth = nomad_server::rpc_auth::ClusterAuth::new(nomad_server::rpc_auth::ClusterKey::generate(), "global");
        let cfg = RaftConfig::new(dir, "127.0.0.1:4647", auth);
        let node = RaftNode::start(cfg, Arc::new(ServerFsm::new(store))).await.expect("raft starts");
        let (leader, _) = watch::channel(false);
        let mut changes = node.leader_changes();
        let me = node.node_id();
        let tx = leader.clone();
        tokio::spawn(async move {
            loop {
                tx.send_replace(*changes.borrow_and_update() == Some(me));
                if changes.changed().await.is_err() {
                    return;
                }
            }
        });
        let mut rx = leader.subscribe();
        tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|l| *l)).await.expect("raft elects itself").ok();
        RaftConsensus { node, leader }
    }
}

impl Consensus for RaftConsensus {
    fn apply(&self, cmd: Command) -> BoxFuture<'_, Result<u64, ApplyError>> {
        Box::pin(async move {
            match self.node.apply(cmd).await {
                Ok((index, r)) => r.error.map_or(Ok(index), |e| Err(ApplyError::Refused(e))),
                Err(RaftError::NoLeader | RaftError::NotLeader) => Err(ApplyError::NoLeader),
                Err(e) => Err(ApplyError::Raft(e.to_string())),
            }
        })
    }
    fn is_leader(&self) -> bool {
        self.node.is_leader()
    }
    fn leadership(&self) -> watch::Receiver<bool> {
        self.leader.subscribe()
    }
    fn leader_rpc_addr(&self) -> Option<String> {
        self.node.leader_addr()
    }
    fn peers(&self) -> Vec<String> {
        self.node.peers()
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args = parse_args();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    runtime.block_on(run(args));
}

async fn run(args: Args) {
    let store = Arc::new(StateStore::new());
    // Simulated nodes go straight into state in one transaction: the bench is about scheduling.
    store
        .write(1, |tx| {
            for i in 0..args.nodes {
                tx.upsert_node(ready_node(&format!("node-{i:05}")), Timestamp::now());
            }
            Ok(())
        })
        .expect("nodes written");

    let tmp = tempfile::tempdir().expect("temp dir");
    let inner: Arc<dyn Consensus> = match args.consensus.as_str() {
        "local" => Arc::new(LocalConsensus::new(store.clone())),
        "raft" => Arc::new(RaftConsensus::start(tmp.path(), store.clone()).await),
        other => panic!("--consensus must be local or raft, not {other}"),
    };
    let consensus = Arc::new(Counting { inner, entries: AtomicU64::new(0), plan_entries: AtomicU64::new(0), plans: AtomicU64::new(0) });
    let heartbeats = Arc::new(Heartbeater::new(HeartbeatConfig::default()));
    let endpoints = Endpoints::new(store.clone(), consensus.clone(), heartbeats.clone(), EndpointConfig::default());
    let (scheduler, scheduler_name) = scheduler_under_test(&args.scheduler);
    let config = LeaderConfig {
        num_schedulers: args.workers,
        evals_in_flight: args.in_flight,
        plan_applier: PlanApplierConfig { max_plans_per_entry: args.max_plans_per_entry, pipeline: args.pipeline },
        ..LeaderConfig::default()
    };
    let deps = LeaderDeps {
        store: store.clone(),
        consensus: consensus.clone(),
        heartbeats,
        heartbeat_expiry: Arc::new(endpoints.clone()) as Arc<dyn HeartbeatExpiry>,
        scheduler,
        volume_watch: Arc::new(endpoints.clone()),
        claim_gc: Arc::new(endpoints.clone()),
        keyring: endpoints.keyring().clone(),
    };
    let leader = Arc::new(Leader::new(deps, config));
    let leader_task = tokio::spawn(leader.clone().run());
    let deadline = Instant::now() + Duration::from_secs(30);
    while !leader.broker().enabled() {
        assert!(Instant::now() < deadline, "leader never started");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let jobs = args.allocs.div_ceil(args.per_job);
    let started = Instant::now();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let make_job = move |i: usize| {
        let count = args.per_job.min(args.allocs - i * args.per_job);
        let mut job = nomad_server::testing::job(&format!("job-{i:05}"), count as i64);
        job.task_groups[0].tasks[0].resources.cpu = 20;
        job.task_groups[0].tasks[0].resources.memory_mb = 32;
        job
    };
    if args.job_rate > 0.0 {
        // Open loop: one registration every 1/rate, whatever the system's pace.
        let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / args.job_rate));
        for i in 0..jobs {
            tick.tick().await;
            let (endpoints, tx, job) = (endpoints.clone(), tx.clone(), make_job(i));
            tokio::spawn(async move {
                let r = endpoints.job_register(job, JobRegisterOptions::default()).await.expect("job registered");
                let _ = tx.send(r.eval_id);
            });
        }
    } else {
        // Burst: registrations as fast as `submitters` concurrent clients manage.
        let next_job = Arc::new(AtomicU64::new(0));
        for _ in 0..args.submitters.max(1) {
            let (endpoints, tx, next_job) = (endpoints.clone(), tx.clone(), next_job.clone());
            tokio::spawn(async move {
                loop {
                    let i = next_job.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= jobs {
                        return;
                    }
                    let r = endpoints.job_register(make_job(i), JobRegisterOptions::default()).await.expect("job registered");
                    let _ = tx.send(r.eval_id);
                }
            });
        }
    }
    drop(tx);
    let mut evals = HashSet::new();
    while let Some(id) = rx.recv().await {
        evals.insert(id);
    }
    let submitted = started.elapsed();

    // Done when every registration eval is terminal.
    let mut last_index = 0;
    loop {
        let snap = store.snapshot();
        if snap.index != last_index {
            last_index = snap.index;
            evals.retain(|id| !snap.eval(id).is_some_and(|e| e.status.is_terminal()));
            if evals.is_empty() {
                break;
            }
        }
        store.wait_for_change(&[Table::Evals], snap.index, Duration::from_millis(200)).await;
        assert!(started.elapsed() < Duration::from_secs(1800), "bench did not finish");
    }
    let elapsed = started.elapsed();
    let snap = store.snapshot();
    let placed = snap.allocs().filter(|a| !a.terminal()).count();
    let failed = snap.evals().filter(|e| e.status == EvalStatus::Failed || !e.failed_tg_allocs.is_empty()).count();
    let mut lat = leader.broker().take_latencies();
    lat.sort();
    leader_task.abort();

    let rate = placed as f64 / elapsed.as_secs_f64();
    let (entries, plan_entries, plans) = (
        consensus.entries.load(Ordering::Relaxed),
        consensus.plan_entries.load(Ordering::Relaxed),
        consensus.plans.load(Ordering::Relaxed),
    );
    println!(
        "nodes={} allocs={} jobs={} consensus={} workers={} in_flight={} max_plans_per_entry={} pipeline={} job_rate={} scheduler=\"{}\" | \
         placed={} in {:.2}s (jobs submitted in {:.2}s) evals_with_failures={} raft_entries={} plan_entries={} plans_per_entry={:.1} | \
         placements/s={:.0} eval_latency_p50={:.1}ms p99={:.1}ms",
        args.nodes,
        args.allocs,
        jobs,
        args.consensus,
        args.workers,
        args.in_flight,
        args.max_plans_per_entry,
        args.pipeline,
        if args.job_rate > 0.0 { format!("{}/s", args.job_rate) } else { "burst".to_string() },
        scheduler_name,
        placed,
        elapsed.as_secs_f64(),
        submitted.as_secs_f64(),
        failed,
        entries,
        plan_entries,
        plans as f64 / plan_entries.max(1) as f64,
        rate,
        percentile(&lat, 0.5).as_secs_f64() * 1e3,
        percentile(&lat, 0.99).as_secs_f64() * 1e3,
    );
}
