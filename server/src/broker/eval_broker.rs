//! The eval broker: pending evals in priority order, at most one in flight
//! per job, at-least-once delivery with ack/nack tokens.
//!
//! Every delivery gets a fresh token. A delivery not acknowledged within the
//! nack timeout is taken back as if nacked. A nacked eval comes back after a
//! delay that grows with its deliveries; at the delivery limit it moves to
//! the failed queue, where the leader marks it `failed` and creates a
//! follow-up. Later evals of a job wait behind the one in flight; when it is
//! acked the newest waiting eval runs and the others become cancelable.
//!
//! Times are `tokio::time::Instant`s so tests can drive them with paused time.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nomad_proto::{Evaluation, NamespacedId, Timestamp};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::BrokerConfig;

/// Why a broker call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BrokerError {
    /// This server is not the leader (or just stopped being it).
    #[error("eval broker disabled")]
    Disabled,
    /// The eval is not delivered to anyone.
    #[error("evaluation is not outstanding")]
    NotOutstanding,
    /// The eval was delivered again, to someone else.
    #[error("evaluation token does not match")]
    TokenMismatch,
    /// The delivery outlived the nack timeout.
    #[error("evaluation nack timeout reached")]
    NackTimeoutReached,
}

/// One delivery of an eval to a worker.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The eval, as enqueued.
    pub eval: Arc<Evaluation>,
    /// Proves this delivery when acking, nacking and submitting plans.
    pub token: String,
}

/// Counts, for tests and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BrokerStats {
    /// Ready to dequeue.
    pub ready: usize,
    /// Delivered, not yet acked.
    pub unacked: usize,
    /// Waiting behind an eval of the same job.
    pub pending: usize,
    /// Waiting for their time (`WaitUntil`, `Wait`, nack delay).
    pub delayed: usize,
    /// Past the delivery limit, waiting to be marked failed.
    pub failed: usize,
    /// Superseded, waiting to be written as canceled.
    pub cancelable: usize,
}

/// Ready queue order: higher priority first, then older (create index), then arrival.
struct Ready {
    eval: Arc<Evaluation>,
    seq: u64,
}

impl Ready {
    fn key(&self) -> (i64, std::cmp::Reverse<u64>, std::cmp::Reverse<u64>) {
        (self.eval.priority, std::cmp::Reverse(self.eval.create_index), std::cmp::Reverse(self.seq))
    }
}

impl PartialEq for Ready {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}
impl Eq for Ready {}
impl PartialOrd for Ready {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Ready {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

struct Unacked {
    eval: Arc<Evaluation>,
    token: String,
    /// Key in `nack_deadlines`; `None` while paused (the plan is queued at the applier).
    deadline: Option<(Instant, u64)>,
    /// Delivered from the failed queue (to the reaper), not to a worker.
    failed: bool,
}

#[derive(Default)]
struct Inner {
    enabled: bool,
    /// Every eval the broker holds, with its number of deliveries.
    deliveries: HashMap<String, u32>,
    /// When each held eval was first enqueued (eval latency).
    enqueued_at: HashMap<String, Instant>,
    /// Per job, the eval that is ready or in flight.
    job_evals: HashMap<NamespacedId, String>,
    /// Per job, evals waiting for that one.
    pending: HashMap<NamespacedId, Vec<Arc<Evaluation>>>,
    ready: BinaryHeap<Ready>,
    unack: HashMap<String, Unacked>,
    /// Evals waiting for a time, keyed by (due, seq).
    delayed: BTreeMap<(Instant, u64), Arc<Evaluation>>,
    /// Nack deadlines of deliveries: (due, seq) → (eval, token).
    nack_deadlines: BTreeMap<(Instant, u64), (String, String)>,
    failed: VecDeque<Arc<Evaluation>>,
    cancelable: Vec<Arc<Evaluation>>,
    latencies: Vec<Duration>,
    seq: u64,
}

impl Inner {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

/// Most eval latencies kept between two [`EvalBroker::take_latencies`] calls.
const MAX_LATENCY_SAMPLES: usize = 1 << 20;

/// The eval broker. Enabled only on the leader.
pub struct EvalBroker {
    config: BrokerConfig,
    inner: Mutex<Inner>,
    ready_changed: Notify,
    failed_changed: Notify,
    timers_changed: Notify,
    cancelable_changed: Notify,
}

impl EvalBroker {
    /// A disabled broker.
    pub fn new(config: BrokerConfig) -> EvalBroker {
        EvalBroker {
            config,
            inner: Mutex::new(Inner::default()),
            ready_changed: Notify::new(),
            failed_changed: Notify::new(),
            timers_changed: Notify::new(),
            cancelable_changed: Notify::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the broker accepts work.
    pub fn enabled(&self) -> bool {
        self.lock().enabled
    }

    /// Enables the broker (leadership won) or disables it and drops
    /// everything it holds (leadership lost); waiting dequeues return.
    pub fn set_enabled(&self, enabled: bool) {
        let mut inner = self.lock();
        if enabled {
            inner.enabled = true;
            return;
        }
        *inner = Inner::default();
        drop(inner);
        self.ready_changed.notify_waiters();
        self.failed_changed.notify_waiters();
        self.timers_changed.notify_waiters();
        self.cancelable_changed.notify_waiters();
    }

    /// Adds a pending eval. Evals already held are ignored; evals with a
    /// future `WaitUntil` (or a `Wait`) are held until due.
    pub fn enqueue(&self, eval: Arc<Evaluation>) {
        let mut inner = self.lock();
        if !inner.enabled || inner.deliveries.contains_key(&eval.id) {
            return;
        }
        let now = Instant::now();
        inner.deliveries.insert(eval.id.clone(), 0);
        inner.enqueued_at.insert(eval.id.clone(), now);
        match due_at(&eval, now, Timestamp::now()) {
            Some(due) => {
                let seq = inner.next_seq();
                inner.delayed.insert((due, seq), eval);
                drop(inner);
                self.timers_changed.notify_one();
            }
            None => self.enqueue_ready(&mut inner, eval),
        }
    }

    /// Puts an eval in the ready queue, or behind its job's eval in flight.
    fn enqueue_ready(&self, inner: &mut Inner, eval: Arc<Evaluation>) {
        let job = eval.namespaced_job_id();
        match inner.job_evals.get(&job) {
            Some(id) if *id != eval.id => {
                inner.pending.entry(job).or_default().push(eval);
                return;
            }
            Some(_) => {}
            None => {
                inner.job_evals.insert(job, eval.id.clone());
            }
        }
        let seq = inner.next_seq();
        inner.ready.push(Ready { eval, seq });
        self.ready_changed.notify_one();
    }

    /// Takes the next ready eval, waiting up to `timeout` for one. `Ok(None)`: none came.
    pub async fn dequeue(&self, timeout: Duration) -> Result<Option<Delivery>, BrokerError> {
        let deadline = Instant::now() + timeout;
        loop {
            let notified = self.ready_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.lock();
                if !inner.enabled {
                    return Err(BrokerError::Disabled);
                }
                if let Some(Ready { eval, .. }) = inner.ready.pop() {
                    let delivery = self.deliver(&mut inner, eval, false);
                    // Another waiter may take the next one.
                    if !inner.ready.is_empty() {
                        self.ready_changed.notify_one();
                    }
                    return Ok(Some(delivery));
                }
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => return Ok(None),
            }
        }
    }

    fn deliver(&self, inner: &mut Inner, eval: Arc<Evaluation>, failed: bool) -> Delivery {
        let token = nomad_proto::new_id();
        let seq = inner.next_seq();
        let key = (Instant::now() + self.config.nack_timeout, seq);
        inner.nack_deadlines.insert(key, (eval.id.clone(), token.clone()));
        *inner.deliveries.entry(eval.id.clone()).or_default() += 1;
        inner.unack.insert(eval.id.clone(), Unacked { eval: eval.clone(), token: token.clone(), deadline: Some(key), failed });
        self.timers_changed.notify_one();
        Delivery { eval, token }
    }

    fn check_token<'a>(inner: &'a mut Inner, eval_id: &str, token: &str) -> Result<&'a mut Unacked, BrokerError> {
        let unack = inner.unack.get_mut(eval_id).ok_or(BrokerError::NotOutstanding)?;
        if unack.token != token {
            return Err(BrokerError::TokenMismatch);
        }
        Ok(unack)
    }

    /// The token of the current delivery of an eval, if it is outstanding.
    pub fn outstanding(&self, eval_id: &str) -> Option<String> {
        self.lock().unack.get(eval_id).map(|u| u.token.clone())
    }

    /// Checks a delivery's token and restarts its nack timer (the worker is making progress).
    pub fn outstanding_reset(&self, eval_id: &str, token: &str) -> Result<(), BrokerError> {
        let nack_timeout = self.config.nack_timeout;
        let mut inner = self.lock();
        let seq = inner.next_seq();
        let unack = Self::check_token(&mut inner, eval_id, token)?;
        let Some(old) = unack.deadline else { return Ok(()) };
        if old.0 <= Instant::now() {
            return Err(BrokerError::NackTimeoutReached);
        }
        let new = (Instant::now() + nack_timeout, seq);
        unack.deadline = Some(new);
        let entry = inner.nack_deadlines.remove(&old).expect("deadline of an outstanding eval");
        inner.nack_deadlines.insert(new, entry);
        Ok(())
    }

    /// Stops a delivery's nack timer while its plan waits at the plan applier,
    /// whose queue may be long under load.
    pub fn pause_nack_timeout(&self, eval_id: &str, token: &str) -> Result<(), BrokerError> {
        let mut inner = self.lock();
        let unack = Self::check_token(&mut inner, eval_id, token)?;
        let Some(old) = unack.deadline.take() else { return Ok(()) };
        if old.0 <= Instant::now() {
            unack.deadline = Some(old);
            return Err(BrokerError::NackTimeoutReached);
        }
        inner.nack_deadlines.remove(&old);
        Ok(())
    }

    /// Restarts a paused nack timer with a full timeout.
    pub fn resume_nack_timeout(&self, eval_id: &str, token: &str) -> Result<(), BrokerError> {
        let nack_timeout = self.config.nack_timeout;
        let mut inner = self.lock();
        let seq = inner.next_seq();
        let unack = Self::check_token(&mut inner, eval_id, token)?;
        if unack.deadline.is_some() {
            return Ok(());
        }
        let key = (Instant::now() + nack_timeout, seq);
        unack.deadline = Some(key);
        inner.nack_deadlines.insert(key, (eval_id.to_string(), token.to_string()));
        drop(inner);
        self.timers_changed.notify_one();
        Ok(())
    }

    /// Acknowledges a delivery: the eval is done. The newest eval waiting
    /// for the same job becomes ready; older waiting ones become cancelable.
    pub fn ack(&self, eval_id: &str, token: &str) -> Result<(), BrokerError> {
        let mut inner = self.lock();
        let unack = Self::check_token(&mut inner, eval_id, token)?;
        if unack.deadline.is_some_and(|d| d.0 <= Instant::now()) {
            return Err(BrokerError::NackTimeoutReached);
        }
        let unack = inner.unack.remove(eval_id).expect("checked above");
        if let Some(d) = unack.deadline {
            inner.nack_deadlines.remove(&d);
        }
        inner.deliveries.remove(eval_id);
        if let Some(at) = inner.enqueued_at.remove(eval_id)
            && inner.latencies.len() < MAX_LATENCY_SAMPLES
        {
            inner.latencies.push(at.elapsed());
        }
        let job = unack.eval.namespaced_job_id();
        inner.job_evals.remove(&job);
        let mut canceled = false;
        if let Some(mut waiting) = inner.pending.remove(&job) {
            // Keep the highest priority, then the newest; the rest would redo its work.
            waiting.sort_by_key(|e| (e.priority, e.modify_index));
            let keep = waiting.pop().expect("pending lists are never empty");
            for old in waiting {
                inner.deliveries.remove(&old.id);
                inner.enqueued_at.remove(&old.id);
                inner.cancelable.push(old);
                canceled = true;
            }
            self.enqueue_ready(&mut inner, keep);
        }
        drop(inner);
        if canceled {
            self.cancelable_changed.notify_one();
        }
        Ok(())
    }

    /// Negatively acknowledges a delivery: the eval is redelivered after a
    /// delay, or moves to the failed queue at the delivery limit.
    pub fn nack(&self, eval_id: &str, token: &str) -> Result<(), BrokerError> {
        let mut inner = self.lock();
        Self::check_token(&mut inner, eval_id, token)?;
        self.nack_locked(&mut inner, eval_id);
        Ok(())
    }

    fn nack_locked(&self, inner: &mut Inner, eval_id: &str) {
        let Some(unack) = inner.unack.remove(eval_id) else { return };
        if let Some(d) = unack.deadline {
            inner.nack_deadlines.remove(&d);
        }
        let deliveries = inner.deliveries.get(eval_id).copied().unwrap_or(0);
        if deliveries >= self.config.delivery_limit {
            // The job stays blocked behind it until the reaper has marked it failed.
            inner.failed.push_back(unack.eval);
            self.failed_changed.notify_one();
            return;
        }
        let delay = self.nack_delay(deliveries);
        if delay.is_zero() {
            self.enqueue_ready(inner, unack.eval);
        } else {
            let seq = inner.next_seq();
            inner.delayed.insert((Instant::now() + delay, seq), unack.eval);
            self.timers_changed.notify_one();
        }
    }

    /// Wait before redelivering an eval delivered `deliveries` times.
    fn nack_delay(&self, deliveries: u32) -> Duration {
        match deliveries {
            0 => Duration::ZERO,
            1 => self.config.initial_nack_delay,
            n => self.config.subsequent_nack_delay * (n - 1),
        }
    }

    /// Takes the next eval past its delivery limit (for the reaper that marks it failed).
    pub async fn dequeue_failed(&self) -> Result<Delivery, BrokerError> {
        loop {
            let notified = self.failed_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.lock();
                if !inner.enabled {
                    return Err(BrokerError::Disabled);
                }
                if let Some(eval) = inner.failed.pop_front() {
                    return Ok(self.deliver(&mut inner, eval, true));
                }
            }
            notified.await;
        }
    }

    /// Takes up to `max` superseded evals to write as canceled, waiting until there is one.
    pub async fn take_cancelable(&self, max: usize) -> Result<Vec<Arc<Evaluation>>, BrokerError> {
        loop {
            let notified = self.cancelable_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut inner = self.lock();
                if !inner.enabled {
                    return Err(BrokerError::Disabled);
                }
                if !inner.cancelable.is_empty() {
                    let n = inner.cancelable.len().min(max);
                    return Ok(inner.cancelable.drain(..n).collect());
                }
            }
            notified.await;
        }
    }

    /// Moves due delayed evals to the ready queue and takes back deliveries
    /// past their nack timeout, until the broker is disabled. Run it on the leader.
    pub async fn run_timers(&self) {
        loop {
            let notified = self.timers_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let now = Instant::now();
            let next = {
                let mut inner = self.lock();
                if !inner.enabled {
                    return;
                }
                while let Some(entry) = inner.delayed.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let eval = entry.remove();
                    self.enqueue_ready(&mut inner, eval);
                }
                while let Some(entry) = inner.nack_deadlines.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    let (id, _token) = entry.remove();
                    tracing::warn!(eval_id = %id, "eval delivery reached its nack timeout");
                    self.nack_locked(&mut inner, &id);
                }
                [inner.delayed.keys().next(), inner.nack_deadlines.keys().next()].into_iter().flatten().map(|k| k.0).min()
            };
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep_until(at) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Eval latencies (first enqueue to ack) recorded since the last call.
    pub fn take_latencies(&self) -> Vec<Duration> {
        std::mem::take(&mut self.lock().latencies)
    }

    /// Current counts.
    pub fn stats(&self) -> BrokerStats {
        let inner = self.lock();
        BrokerStats {
            ready: inner.ready.len(),
            unacked: inner.unack.values().filter(|u| !u.failed).count(),
            pending: inner.pending.values().map(Vec::len).sum(),
            delayed: inner.delayed.len(),
            failed: inner.failed.len() + inner.unack.values().filter(|u| u.failed).count(),
            cancelable: inner.cancelable.len(),
        }
    }
}

/// When a new eval may first run, if that is in the future: its `WaitUntil`
/// (wall clock) or its `Wait` (relative to now), whichever is later.
fn due_at(eval: &Evaluation, now: Instant, wall_now: Timestamp) -> Option<Instant> {
    let until = (!eval.wait_until.is_zero() && eval.wait_until > wall_now)
        .then(|| Duration::from_nanos((eval.wait_until.unix_nanos() - wall_now.unix_nanos()) as u64));
    let wait = (eval.wait > 0).then(|| Duration::from_nanos(eval.wait as u64));
    until.into_iter().chain(wait).max().map(|d| now + d)
}
