//! The event broker: a ring buffer of recent batches plus live fan-out.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use super::{Event, EventBatch};

/// How many batches a subscriber may fall behind the live stream before it
/// is dropped (it can resume from its last index).
const LIVE_LAG: usize = 4096;

/// Recent batches and the live stream.
pub struct EventBroker {
    buffer: Mutex<VecDeque<Arc<EventBatch>>>,
    capacity: usize,
    live: broadcast::Sender<Arc<EventBatch>>,
}

impl std::fmt::Debug for EventBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventBroker").field("capacity", &self.capacity).finish()
    }
}

/// Which events a subscriber wants: topic → keys (`*` matches all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicFilter {
    topics: BTreeMap<String, Vec<String>>,
    namespace: String,
}

/// A `topic` query that cannot be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid topic query: {0}")]
pub struct SubscribeError(pub String);

impl TopicFilter {
    /// Parses `topic` values (`Job:web`, `Node`, `*`) and a namespace (`*` for all).
    pub fn parse<'a>(topics: impl IntoIterator<Item = &'a str>, namespace: &str) -> Result<TopicFilter, SubscribeError> {
        let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for t in topics {
            let parts: Vec<&str> = t.split(':').collect();
            let (topic, key) = match parts.as_slice() {
                [topic] if !topic.is_empty() => (*topic, "*"),
                [topic, key] if !topic.is_empty() && !key.is_empty() => (*topic, *key),
                _ => return Err(SubscribeError(format!("invalid topic format {t:?}: expected Topic or Topic:Key"))),
            };
            map.entry(topic.to_string()).or_default().push(key.to_string());
        }
        if map.is_empty() {
            map.insert("*".into(), vec!["*".into()]);
        }
        Ok(TopicFilter { topics: map, namespace: namespace.to_string() })
    }

    /// Whether an event passes the filter.
    pub fn matches(&self, e: &Event) -> bool {
        let ns_ok = self.namespace == "*" || e.namespace.is_empty() || e.namespace == self.namespace;
        if !ns_ok {
            return false;
        }
        let key_ok = |keys: &Vec<String>| keys.iter().any(|k| k == "*" || *k == e.key || e.filter_keys.iter().any(|f| f == k));
        self.topics.get("*").is_some_and(key_ok) || self.topics.get(&e.topic).is_some_and(key_ok)
    }

    /// The batch with only matching events, or `None` when nothing matches.
    pub fn apply(&self, b: &EventBatch) -> Option<EventBatch> {
        self.apply_where(b, |_| true)
    }

    /// [`TopicFilter::apply`], keeping only the events `allow` also passes (what a token may read).
    pub fn apply_where(&self, b: &EventBatch, allow: impl Fn(&Event) -> bool) -> Option<EventBatch> {
        let events: Vec<Event> = b.events.iter().filter(|e| self.matches(e) && allow(e)).cloned().collect();
        (!events.is_empty()).then_some(EventBatch { index: b.index, events })
    }

    /// The topics asked for (`*` for all).
    pub fn topics(&self) -> impl Iterator<Item = &str> {
        self.topics.keys().map(String::as_str)
    }

    /// The namespace asked for (`*` for all).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }
}

/// A subscriber's position: buffered batches first, then live ones.
pub struct Subscription {
    backlog: VecDeque<Arc<EventBatch>>,
    last: u64,
    live: broadcast::Receiver<Arc<EventBatch>>,
}

/// Why a subscription ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscriptionClosed {
    /// The subscriber fell too far behind.
    #[error("subscription closed by server: the client fell more than {0} batches behind; resume from the last index received")]
    TooSlow(usize),
    /// The broker is gone (server shutting down).
    #[error("subscription closed by server: event broker shut down")]
    Shutdown,
}

impl Subscription {
    /// The next batch, in index order, each index once.
    pub async fn next(&mut self) -> Result<Arc<EventBatch>, SubscriptionClosed> {
        if let Some(b) = self.backlog.pop_front() {
            self.last = b.index;
            return Ok(b);
        }
        loop {
            match self.live.recv().await {
                Ok(b) if b.index <= self.last => continue,
                Ok(b) => {
                    self.last = b.index;
                    return Ok(b);
                }
                Err(broadcast::error::RecvError::Lagged(_)) => return Err(SubscriptionClosed::TooSlow(LIVE_LAG)),
                Err(broadcast::error::RecvError::Closed) => return Err(SubscriptionClosed::Shutdown),
            }
        }
    }
}

impl EventBroker {
    /// A broker keeping the last `capacity` batches (Nomad's default is 100).
    pub fn new(capacity: usize) -> EventBroker {
        EventBroker { buffer: Mutex::new(VecDeque::new()), capacity: capacity.max(1), live: broadcast::channel(LIVE_LAG).0 }
    }

    /// Adds a batch. Called by the FSM after a commit, in index order.
    pub fn publish(&self, batch: EventBatch) {
        let batch = Arc::new(batch);
        let mut buf = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        // A replay after restore may repeat indexes already buffered; keep order and uniqueness.
        if buf.back().is_some_and(|b| b.index >= batch.index) {
            buf.retain(|b| b.index < batch.index);
        }
        buf.push_back(batch.clone());
        while buf.len() > self.capacity {
            buf.pop_front();
        }
        let _ = self.live.send(batch);
    }

    /// Subscribes from `index`: 0 replays the whole buffer; otherwise the
    /// first buffered batch at or after `index`, or the oldest one if
    /// `index` is older than the buffer, or the newest if it is newer than all.
    pub fn subscribe(&self, index: u64) -> Subscription {
        let buf = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        // Subscribe while holding the lock so no batch falls between backlog and live.
        let live = self.live.subscribe();
        let backlog: VecDeque<Arc<EventBatch>> = if index == 0 {
            buf.iter().cloned().collect()
        } else {
            let from: VecDeque<Arc<EventBatch>> = buf.iter().filter(|b| b.index >= index).cloned().collect();
            if from.is_empty() { buf.back().cloned().into_iter().collect() } else { from }
        };
        Subscription { backlog, last: 0, live }
    }

    /// Indexes currently buffered (oldest first).
    pub fn buffered_indexes(&self) -> Vec<u64> {
        self.buffer.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|b| b.index).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(index: u64, topic: &str, key: &str, ns: &str) -> EventBatch {
        EventBatch {
            index,
            events: vec![Event {
                topic: topic.into(),
                event_type: "T".into(),
                key: key.into(),
                namespace: ns.into(),
                filter_keys: vec!["job-x".into()],
                index,
                payload: serde_json::Value::Null,
            }],
        }
    }

    #[tokio::test]
    async fn resume_positions_follow_nomad() {
        let b = EventBroker::new(3);
        for i in 1..=5 {
            b.publish(batch(i * 10, "Job", "a", "default"));
        }
        assert_eq!(b.buffered_indexes(), vec![30, 40, 50]);
        let first = |i: u64| {
            let mut s = b.subscribe(i);
            s.backlog.pop_front().map(|x| x.index)
        };
        assert_eq!(first(0), Some(30), "0 replays the buffer");
        assert_eq!(first(5), Some(30), "older than the buffer starts at the oldest");
        assert_eq!(first(35), Some(40));
        assert_eq!(first(40), Some(40));
        assert_eq!(first(99), Some(50), "newer than all delivers the newest");
    }

    #[tokio::test]
    async fn live_batches_follow_the_backlog_once_each() {
        let b = EventBroker::new(10);
        b.publish(batch(1, "Job", "a", "default"));
        let mut s = b.subscribe(0);
        b.publish(batch(2, "Job", "a", "default"));
        assert_eq!(s.next().await.unwrap().index, 1);
        assert_eq!(s.next().await.unwrap().index, 2);
        b.publish(batch(3, "Job", "a", "default"));
        assert_eq!(s.next().await.unwrap().index, 3);
    }

    #[tokio::test]
    async fn a_slow_subscriber_is_dropped_with_a_clear_reason() {
        let b = EventBroker::new(2);
        let mut s = b.subscribe(1_000_000);
        for i in 1..=(LIVE_LAG as u64 + 10) {
            b.publish(batch(i, "Job", "a", "default"));
        }
        // The backlog (newest batch) comes first, then the lag is noticed.
        let mut err = None;
        for _ in 0..3 {
            if let Err(e) = s.next().await {
                err = Some(e);
                break;
            }
        }
        let e = err.expect("lagging subscriber closed");
        assert!(e.to_string().contains("fell more than"), "{e}");
    }

    #[test]
    fn filters_by_topic_key_filter_key_and_namespace() {
        let ev = &batch(1, "Evaluation", "e1", "prod").events[0];
        let f = |t: &[&str], ns: &str| TopicFilter::parse(t.iter().copied(), ns).unwrap().matches(ev);
        assert!(f(&[], "*"));
        assert!(f(&["Evaluation"], "prod"));
        assert!(f(&["Evaluation:e1"], "prod"));
        assert!(f(&["Evaluation:job-x"], "prod"), "filter keys match");
        assert!(!f(&["Evaluation:other"], "prod"));
        assert!(!f(&["Job"], "prod"));
        assert!(!f(&["*"], "default"), "other namespaces are filtered");
        let node = &batch(1, "Node", "n1", "").events[0];
        assert!(TopicFilter::parse(["Node"], "default").unwrap().matches(node), "nodes have no namespace");
        assert!(TopicFilter::parse(["Job:a:b"], "default").is_err());
        assert!(TopicFilter::parse([":x"], "default").is_err());
    }
}
