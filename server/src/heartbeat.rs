//! Leader-held heartbeat timers.
//!
//! Every node that is not `down` has a deadline. A node that heartbeats
//! (`Node.UpdateStatus`) or registers gets a new TTL; when a deadline passes
//! the node's expiry is handed to [`HeartbeatExpiry`]. Only the leader keeps
//! timers: they are armed when leadership is won (with the failover TTL, so a
//! new leader does not mark the whole fleet down) and cleared when it is lost.
//!
//! TTLs follow Nomad: `base = max(min_heartbeat_ttl, nodes / max_heartbeats_per_second)`,
//! `ttl = base + uniform[0, base)`; the server waits `ttl + heartbeat_grace`.
//! One task drives every timer from an ordered queue, so 10,000 nodes cost
//! one sleeping task, not 10,000.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::consensus::BoxFuture;

/// Heartbeat settings (`server { heartbeat_grace min_heartbeat_ttl max_heartbeats_per_second }`).
#[derive(Debug, Clone, PartialEq)]
pub struct HeartbeatConfig {
    /// Shortest TTL given to a client.
    pub min_ttl: Duration,
    /// Rate the leader aims for; TTLs grow with the node count to keep it.
    pub max_per_second: f64,
    /// Extra time the server waits past the TTL.
    pub grace: Duration,
    /// TTL given to every node when a server wins leadership.
    pub failover_ttl: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            min_ttl: Duration::from_secs(10),
            max_per_second: 50.0,
            grace: Duration::from_secs(10),
            failover_ttl: Duration::from_secs(300),
        }
    }
}

impl HeartbeatConfig {
    /// `max(min_ttl, nodes / rate)`: the TTL that keeps the leader near its target rate.
    pub fn base_ttl(&self, nodes: usize) -> Duration {
        // NaN compares false with everything, and `from_secs_f64(NaN)` panics.
        if self.max_per_second.is_nan() || self.max_per_second <= 1.0 / 86_400.0 {
            return self.min_ttl;
        }
        let scaled = Duration::from_secs_f64(nodes as f64 / self.max_per_second);
        scaled.max(self.min_ttl)
    }

    /// A TTL for a client: the base plus a random stagger in `[0, base)`.
    pub fn ttl(&self, nodes: usize, rng: &mut impl Rng) -> Duration {
        let base = self.base_ttl(nodes);
        let stagger = if base.is_zero() { Duration::ZERO } else { base.mul_f64(rng.random::<f64>()) };
        base + stagger
    }
}

/// What the heartbeater calls when a node's deadline passes.
pub trait HeartbeatExpiry: Send + Sync + 'static {
    /// The node missed its heartbeat; decide its new status and write it.
    fn node_expired(&self, node_id: String) -> BoxFuture<'_, ()>;
}

#[derive(Default)]
struct Timers {
    deadlines: HashMap<String, (Instant, u64)>,
    queue: BTreeMap<(Instant, u64), String>,
    seq: u64,
    armed: bool,
}

impl Timers {
    fn set(&mut self, node_id: &str, at: Instant) {
        self.remove(node_id);
        self.seq += 1;
        let key = (at, self.seq);
        self.queue.insert(key, node_id.to_string());
        self.deadlines.insert(node_id.to_string(), key);
    }

    fn remove(&mut self, node_id: &str) {
        if let Some(key) = self.deadlines.remove(node_id) {
            self.queue.remove(&key);
        }
    }
}

/// The leader's heartbeat timers.
pub struct Heartbeater {
    config: HeartbeatConfig,
    timers: Mutex<Timers>,
    changed: Notify,
}

/// Why a timer could not be reset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to reset heartbeat since server is not leader")]
pub struct NotLeader;

impl Heartbeater {
    /// Timers with these settings, disarmed until [`Heartbeater::arm`].
    pub fn new(config: HeartbeatConfig) -> Heartbeater {
        Heartbeater { config, timers: Mutex::new(Timers::default()), changed: Notify::new() }
    }

    /// The settings.
    pub fn config(&self) -> &HeartbeatConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Timers> {
        self.timers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives `node_id` a fresh TTL and returns it (what the client is told).
    pub fn reset(&self, node_id: &str) -> Result<Duration, NotLeader> {
        let mut t = self.lock();
        if !t.armed {
            return Err(NotLeader);
        }
        let ttl = self.config.ttl(t.deadlines.len(), &mut rand::rng());
        t.set(node_id, Instant::now() + ttl + self.config.grace);
        drop(t);
        self.changed.notify_one();
        Ok(ttl)
    }

    /// Stops tracking a node (it went down or was removed).
    pub fn remove(&self, node_id: &str) {
        self.lock().remove(node_id);
        self.changed.notify_one();
    }

    /// Starts keeping timers (leadership won): every given node gets the
    /// failover TTL, with no stagger and no grace.
    pub fn arm(&self, nodes: impl IntoIterator<Item = String>) {
        let mut t = self.lock();
        t.armed = true;
        let at = Instant::now() + self.config.failover_ttl;
        for n in nodes {
            t.set(&n, at);
        }
        drop(t);
        self.changed.notify_one();
    }

    /// Drops every timer (leadership lost).
    pub fn disarm(&self) {
        let mut t = self.lock();
        *t = Timers::default();
        drop(t);
        self.changed.notify_one();
    }

    /// Number of nodes with a timer.
    pub fn tracked(&self) -> usize {
        self.lock().deadlines.len()
    }

    /// The deadline of a node, if it has one.
    pub fn deadline(&self, node_id: &str) -> Option<Instant> {
        self.lock().deadlines.get(node_id).map(|k| k.0)
    }

    /// Fires expired timers until the task is dropped. Each expiry is handled
    /// on its own task so one slow write does not delay the others.
    pub async fn run(self: Arc<Self>, expiry: Arc<dyn HeartbeatExpiry>) {
        loop {
            let next = {
                let mut t = self.lock();
                let now = Instant::now();
                let mut due = Vec::new();
                while let Some((&(at, seq), _)) = t.queue.first_key_value() {
                    if at > now {
                        break;
                    }
                    let node = t.queue.remove(&(at, seq)).expect("first key exists");
                    t.deadlines.remove(&node);
                    due.push(node);
                }
                for node in due {
                    let expiry = expiry.clone();
                    tokio::spawn(async move { expiry.node_expired(node).await });
                }
                t.queue.first_key_value().map(|(k, _)| k.0)
            };
            match next {
                Some(at) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {}
                        _ = self.changed.notified() => {}
                    }
                }
                None => self.changed.notified().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc;

    struct Record(mpsc::UnboundedSender<String>);

    impl HeartbeatExpiry for Record {
        fn node_expired(&self, node_id: String) -> BoxFuture<'_, ()> {
            let _ = self.0.send(node_id);
            Box::pin(async {})
        }
    }

    fn fast() -> HeartbeatConfig {
        HeartbeatConfig {
            min_ttl: Duration::from_millis(50),
            max_per_second: 50.0,
            grace: Duration::from_millis(10),
            failover_ttl: Duration::from_millis(40),
        }
    }

    #[test]
    fn a_rate_that_is_not_a_number_gives_the_minimum_ttl() {
        for rate in [f64::NAN, 0.0, -5.0, f64::NEG_INFINITY] {
            let c = HeartbeatConfig { max_per_second: rate, ..HeartbeatConfig::default() };
            assert_eq!(c.base_ttl(1_000_000), c.min_ttl, "{rate}");
        }
    }

    #[test]
    fn ttl_scales_with_the_fleet_like_nomad() {
        let c = HeartbeatConfig::default();
        assert_eq!(c.base_ttl(10), Duration::from_secs(10));
        assert_eq!(c.base_ttl(1_000), Duration::from_secs(20));
        assert_eq!(c.base_ttl(10_000), Duration::from_secs(200));
        let mut rng = rand::rng();
        for _ in 0..100 {
            let ttl = c.ttl(5_000, &mut rng);
            assert!(ttl >= Duration::from_secs(100) && ttl < Duration::from_secs(200), "{ttl:?}");
        }
    }

    #[test]
    fn a_disarmed_heartbeater_refuses_resets() {
        let h = Heartbeater::new(fast());
        assert_eq!(h.reset("n1"), Err(NotLeader));
        h.arm(Vec::<String>::new());
        assert!(h.reset("n1").is_ok());
        h.disarm();
        assert_eq!(h.tracked(), 0);
        assert_eq!(h.reset("n1"), Err(NotLeader));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_nodes_are_reported_and_heartbeats_postpone_expiry() {
        let h = Arc::new(Heartbeater::new(fast()));
        h.arm(vec!["failover".to_string()]);
        let ttl = h.reset("beating").unwrap();
        assert!(ttl >= Duration::from_millis(50) && ttl < Duration::from_millis(100));
        h.reset("silent").unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(h.clone().run(Arc::new(Record(tx))));
        // The failover timer (40 ms, no grace) fires first.
        assert_eq!(rx.recv().await.unwrap(), "failover");
        // Keep one node heartbeating while the other's deadline passes.
        let silent_deadline = h.deadline("silent").unwrap();
        while Instant::now() < silent_deadline {
            h.reset("beating").unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(rx.recv().await.unwrap(), "silent");
        assert!(h.deadline("beating").is_some(), "the heartbeating node still has a timer");
        assert_eq!(h.tracked(), 1);
        task.abort();
    }
}
