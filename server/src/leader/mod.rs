//! Leader-only subsystems, started when leadership is won and stopped when it is lost.
//!
//! Each subsystem gets only the handles it needs: the broker and the plan
//! applier see consensus as "apply this command", the heartbeat timers see
//! node expiry as [`HeartbeatExpiry`], the drainer sees its two writes as
//! [`DrainWriter`], workers see the scheduler as a pure function, the volume
//! watcher and the claim GC see CSI volumes as [`VolumeWatchHandle`] and
//! [`ClaimGcHandle`], the periodic dispatcher sees jobs as [`PeriodicJobs`]. Nothing here
//! holds the whole server.

pub mod acl_token_gc;
pub mod core_gc;
pub mod csi_claim_gc;
pub mod deployment_watcher;
pub mod keyring;
pub mod periodic;
pub mod volume_watcher;

use std::sync::Arc;

pub use acl_token_gc::{StoreTokens, TokenGc, TokenGcConfig};
pub use csi_claim_gc::{ClaimGc, ClaimGcConfig, ClaimGcHandle};
pub use keyring::{KeyringConfig, KeyringLoop};
use nomad_proto::NodeStatus;
pub use periodic::{PeriodicDispatcher, PeriodicJobs, StorePeriodicJobs};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
pub use volume_watcher::{VolumeWatchHandle, VolumeWatcher, VolumeWatcherConfig};

use crate::broker::{BlockedEvals, BrokerConfig, CANCELED_SUPERSEDED, ChangeWatcher, EvalBroker, EvalWriter, reap_failed_evals};
use crate::consensus::Consensus;
use crate::consul::ConsulAcl;
use crate::consul::revoker::{ConsensusPurger, Revoker, RevokerConfig};
use crate::drainer::{ConsensusDrainWriter, DrainWriter, Drainer, DrainerConfig};
use crate::heartbeat::{HeartbeatExpiry, Heartbeater};
use crate::plan_apply::{PlanApplierConfig, spawn_plan_applier};
use crate::scheduler::Scheduler;
use crate::state::{StateStore, Table};
use crate::worker::{Worker, WorkerConfig};

/// Ticks every `interval` (at least 1 ms), the first one interval from now; a late tick
/// delays the next rather than bunching them (the leader's periodic GC loops).
pub(crate) fn periodic_ticks(interval: std::time::Duration) -> tokio::time::Interval {
    let interval = interval.max(std::time::Duration::from_millis(1));
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// Leader settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaderConfig {
    /// Schedulers running at once (Nomad's `num_schedulers`; default: one per core).
    pub num_schedulers: usize,
    /// Evals worked on at once. Above `num_schedulers`, the extra workers
    /// hold evals whose plans wait at the applier, so plans queue up and
    /// share Raft entries instead of each paying a full write.
    pub evals_in_flight: usize,
    /// Eval broker.
    pub broker: BrokerConfig,
    /// Plan applier.
    pub plan_applier: PlanApplierConfig,
    /// Workers.
    pub worker: WorkerConfig,
    /// The node drainer.
    pub drainer: DrainerConfig,
    /// The CSI volume watcher.
    pub volume_watcher: VolumeWatcherConfig,
    /// The CSI volume claim GC.
    pub csi_claim_gc: ClaimGcConfig,
    /// The SI token revoker.
    pub si_revoker: RevokerConfig,
    /// The expired ACL token GC; `None` while ACLs are off.
    pub acl_token_gc: Option<TokenGcConfig>,
    /// The periodic GC of finished jobs, evals, deployments and down nodes.
    pub core_gc: crate::endpoints::GcConfig,
    /// Root key creation, rotation, rekeying and GC.
    pub keyring: KeyringConfig,
}

impl Default for LeaderConfig {
    fn default() -> Self {
        LeaderConfig {
            num_schedulers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            evals_in_flight: 8 * std::thread::available_parallelism().map_or(1, |n| n.get()),
            broker: BrokerConfig::default(),
            plan_applier: PlanApplierConfig::default(),
            worker: WorkerConfig::default(),
            drainer: DrainerConfig::default(),
            volume_watcher: VolumeWatcherConfig::default(),
            csi_claim_gc: ClaimGcConfig::default(),
            si_revoker: RevokerConfig::default(),
            acl_token_gc: None,
            core_gc: crate::endpoints::GcConfig::default(),
            keyring: KeyringConfig::default(),
        }
    }
}

/// What the leader's subsystems use.
#[derive(Clone)]
pub struct LeaderDeps {
    /// State.
    pub store: Arc<StateStore>,
    /// Writes, and who leads.
    pub consensus: Arc<dyn Consensus>,
    /// Heartbeat timers.
    pub heartbeats: Arc<Heartbeater>,
    /// What a missed heartbeat does (the node endpoints).
    pub heartbeat_expiry: Arc<dyn HeartbeatExpiry>,
    /// The schedulers.
    pub scheduler: Arc<dyn Scheduler>,
    /// What the volume watcher sees of CSI volumes (the CSI endpoints).
    pub volume_watch: Arc<dyn VolumeWatchHandle>,
    /// What the claim GC sees of CSI volumes (the CSI endpoints).
    pub claim_gc: Arc<dyn ClaimGcHandle>,
    /// Root key material.
    pub keyring: Arc<crate::keyring::Keyring>,
}

/// Runs the leader-only subsystems while this server leads.
pub struct Leader {
    deps: LeaderDeps,
    config: LeaderConfig,
    broker: Arc<EvalBroker>,
    blocked: Arc<BlockedEvals>,
    /// Revokes the SI tokens of dead allocs (none without Consul).
    consul_acl: Option<Arc<dyn ConsulAcl>>,
}

/// The tasks of one term of leadership; dropping them stops them.
struct Term {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Term {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Leader {
    /// A leader that has not started anything yet.
    pub fn new(deps: LeaderDeps, config: LeaderConfig) -> Leader {
        let broker = Arc::new(EvalBroker::new(config.broker.clone()));
        Leader { deps, config, broker, blocked: Arc::new(BlockedEvals::new()), consul_acl: None }
    }

    /// This leader, also running the SI token revoker over `acl` while it leads.
    pub fn with_consul_acl(mut self, acl: Option<Arc<dyn ConsulAcl>>) -> Leader {
        self.consul_acl = acl;
        self
    }

    /// The eval broker (enabled while leading).
    pub fn broker(&self) -> &Arc<EvalBroker> {
        &self.broker
    }

    /// The blocked-eval tracker (enabled while leading).
    pub fn blocked(&self) -> &Arc<BlockedEvals> {
        &self.blocked
    }

    /// Follows leadership until the consensus handle goes away (or the task is dropped). When
    /// the whole state is replaced while leading (an operator's snapshot restore), the term's
    /// subsystems start over from the new state, as Nomad's leader re-asserts itself: the
    /// broker's queue, blocked evals and heartbeat timers described the old one.
    pub async fn run(self: Arc<Self>) {
        let mut leadership = self.deps.consensus.leadership();
        let mut restores = self.deps.store.restores();
        restores.borrow_and_update();
        let config = self.deps.store.snapshot();
        let (mut config_index, mut paused) = (config.table_index(Table::SchedulerConfig), config.scheduler_config().pause_eval_broker);
        let mut term: Option<Term> = None;
        loop {
            let leading = *leadership.borrow_and_update();
            match (leading, term.is_some()) {
                (true, false) => term = Some(self.establish()),
                (false, true) => self.revoke(term.take()),
                _ => {}
            }
            tokio::select! {
                changed = leadership.changed() => {
                    if changed.is_err() {
                        self.revoke(term.take());
                        return;
                    }
                }
                Ok(()) = restores.changed() => {
                    if term.is_some() {
                        tracing::info!("the state was restored from a snapshot: restarting the leader's subsystems on it");
                        self.revoke(term.take());
                    }
                }
                // Pausing or resuming the eval broker (`PauseEvalBroker`) starts the term over
                // with the broker off or on: resumed, it is filled from the state again.
                () = self.deps.store.wait_for_change(&[Table::SchedulerConfig], config_index, std::time::Duration::from_secs(3600)) => {
                    let config = self.deps.store.snapshot();
                    config_index = config.table_index(Table::SchedulerConfig);
                    let now_paused = config.scheduler_config().pause_eval_broker;
                    if now_paused != paused && term.is_some() {
                        tracing::info!(paused = now_paused, "eval broker status modified: restarting the leader's subsystems");
                        self.revoke(term.take());
                    }
                    paused = now_paused;
                }
            }
        }
    }

    fn establish(&self) -> Term {
        tracing::info!(
            "leadership won: starting the eval broker, workers, plan applier, heartbeat timers, node drainer, CSI volume watcher and claim GC, periodic dispatcher, deployment watcher, SI token revoker"
        );
        let d = &self.deps;
        // A paused broker (Nomad's `PauseEvalBroker`) takes and schedules nothing: the workers
        // and the loops that feed on it end at once; evals wait in the state.
        let paused = d.store.snapshot().scheduler_config().pause_eval_broker;
        if paused {
            tracing::info!("the eval broker is paused by the scheduler configuration: no eval is scheduled until it is resumed");
        }
        self.broker.set_enabled(!paused);
        self.blocked.set_enabled(!paused);
        let mut tasks = Vec::new();

        let (writer, writer_task) = EvalWriter::spawn(d.consensus.clone());
        tasks.push(writer_task);
        let watcher = ChangeWatcher::new(d.store.clone(), self.broker.clone(), self.blocked.clone(), writer.clone());
        tasks.push(tokio::spawn(watcher.run(self.config.broker.failed_unblock_interval)));
        let broker = self.broker.clone();
        tasks.push(tokio::spawn(async move { broker.run_timers().await }));
        tasks.push(tokio::spawn(reap_failed_evals(self.broker.clone(), writer.clone())));
        tasks.push(tokio::spawn(cancel_superseded(self.broker.clone(), writer)));

        let (plans, applier_task) =
            spawn_plan_applier(d.store.clone(), d.consensus.clone(), self.broker.clone(), self.config.plan_applier.clone());
        tasks.push(applier_task);
        let compute_slots = Arc::new(Semaphore::new(self.config.num_schedulers.max(1)));
        for _ in 0..self.config.evals_in_flight.max(self.config.num_schedulers).max(1) {
            let w = Worker::new(
                self.broker.clone(),
                d.store.clone(),
                d.scheduler.clone(),
                plans.clone(),
                self.config.worker.clone(),
                compute_slots.clone(),
            );
            tasks.push(tokio::spawn(w.run()));
        }

        let live_nodes: Vec<String> = d.store.snapshot().nodes().filter(|n| n.status != NodeStatus::Down).map(|n| n.id.clone()).collect();
        d.heartbeats.arm(live_nodes);
        tasks.push(tokio::spawn(d.heartbeats.clone().run(d.heartbeat_expiry.clone())));

        let writer: Arc<dyn DrainWriter> = Arc::new(ConsensusDrainWriter(d.consensus.clone()));
        tasks.push(tokio::spawn(Drainer::new(d.store.clone(), writer, self.config.drainer.clone()).run()));

        tasks.push(tokio::spawn(VolumeWatcher::new(d.volume_watch.clone(), self.config.volume_watcher.clone()).run()));
        tasks.push(tokio::spawn(ClaimGc::new(d.claim_gc.clone(), self.config.csi_claim_gc.clone()).run()));
        let keyring = KeyringLoop::new(d.store.clone(), d.consensus.clone(), d.keyring.clone(), self.config.keyring.clone());
        tasks.push(tokio::spawn(keyring.run()));
        let periodic = Arc::new(StorePeriodicJobs { store: d.store.clone(), consensus: d.consensus.clone() });
        tasks.push(tokio::spawn(PeriodicDispatcher::new(periodic).run()));
        tasks.push(tokio::spawn(deployment_watcher::DeploymentWatcher::new(d.store.clone(), d.consensus.clone()).run()));
        tasks.push(tokio::spawn(core_gc::CoreGc::new(d.store.clone(), d.consensus.clone(), self.config.core_gc.clone()).run()));
        if let Some(config) = &self.config.acl_token_gc {
            tracing::info!(threshold = ?config.threshold, "starting the expired ACL token GC");
            let tokens = Arc::new(StoreTokens { store: d.store.clone(), consensus: d.consensus.clone() });
            tasks.push(tokio::spawn(TokenGc::new(tokens, config.clone()).run()));
        }
        // Its first pass revokes the tokens of allocs that died while no leader watched.
        match &self.consul_acl {
            Some(acl) => {
                let purger = Arc::new(ConsensusPurger(d.consensus.clone()));
                tasks.push(tokio::spawn(Revoker::new(d.store.clone(), acl.clone(), purger, self.config.si_revoker.clone()).run()));
            }
            None => {
                let orphaned = d.store.snapshot().si_token_accessors().count();
                if orphaned > 0 {
                    tracing::warn!(
                        accessors = orphaned,
                        "SI tokens are stored but this server has no consul {{}} block to revoke them with"
                    );
                }
            }
        }
        Term { tasks }
    }

    fn revoke(&self, term: Option<Term>) {
        let Some(term) = term else { return };
        tracing::info!("leadership lost: stopping leader-only subsystems");
        drop(term);
        self.broker.set_enabled(false);
        self.blocked.set_enabled(false);
        self.deps.heartbeats.disarm();
    }
}

/// Writes evals the broker superseded as canceled, in batches.
async fn cancel_superseded(broker: Arc<EvalBroker>, writer: EvalWriter) {
    let now = || nomad_proto::Timestamp::now().unix_nanos();
    while let Ok(evals) = broker.take_cancelable(crate::broker::MAX_EVALS_PER_WRITE).await {
        let evals = evals
            .into_iter()
            .map(|e| {
                let mut e = (*e).clone();
                e.status = nomad_proto::EvalStatus::Canceled;
                e.status_description = CANCELED_SUPERSEDED.to_string();
                e.modify_time = now().max(e.create_time + 1);
                e
            })
            .collect();
        if let Err(e) = writer.write(evals).await {
            tracing::warn!(error = %e, "failed to cancel superseded evals");
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod drain_tests;

#[cfg(test)]
mod node_eval_tests;

#[cfg(test)]
mod csi_tests;
