//! The agent's log lines for whoever monitors them (`/v1/agent/monitor`).
//!
//! The agent's logging layer hands every event a monitor wants to [`LogHub::publish`], which
//! renders it (text or JSON, each at most once per event) and offers it to each subscriber's
//! bounded queue. A subscriber that does not keep up loses lines, counted, and is told how many
//! when it next reads ([`Subscription::next_line`]): a slow reader never grows memory, as with
//! Nomad's monitor, whose buffer drops too.
//!
//! The hub knows the most verbose level any subscriber wants ([`LogHub::max_level`]); the
//! logging layer's filter asks it, and the hub rebuilds tracing's callsite interest whenever
//! that changes, so with no monitor attached no event below the agent's own level is even
//! built.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::Level;

/// Lines queued for one subscriber at most (Nomad's monitor buffers 512).
pub const SUBSCRIBER_BUFFER: usize = 512;
/// Longest line kept; the rest is cut (a line ends with `\n` either way).
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// Monitors attached at once at most.
pub const MAX_SUBSCRIBERS: usize = 32;

struct Subscriber {
    id: u64,
    level: Level,
    json: bool,
    tx: mpsc::Sender<Bytes>,
    dropped: AtomicU64,
}

/// Fans log lines out to monitors.
pub struct LogHub {
    subscribers: Mutex<Vec<Arc<Subscriber>>>,
    next_id: AtomicU64,
    /// The most verbose level wanted, as [`level_rank`]; 0 with no subscriber.
    max_rank: AtomicUsize,
}

/// Why a subscription was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    /// [`MAX_SUBSCRIBERS`] monitors are attached already.
    #[error("too many monitor requests: {0} are streaming already")]
    TooMany(usize),
}

/// 1 (error) to 5 (trace); more verbose is larger.
fn level_rank(level: Level) -> usize {
    match level {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

impl Default for LogHub {
    fn default() -> LogHub {
        LogHub { subscribers: Mutex::new(Vec::new()), next_id: AtomicU64::new(1), max_rank: AtomicUsize::new(0) }
    }
}

impl LogHub {
    /// The process's hub, which the agent's logging layer publishes to.
    pub fn global() -> &'static Arc<LogHub> {
        static HUB: OnceLock<Arc<LogHub>> = OnceLock::new();
        HUB.get_or_init(|| Arc::new(LogHub::default()))
    }

    /// The most verbose level any subscriber wants; `None` with no subscriber.
    pub fn max_level(&self) -> Option<Level> {
        match self.max_rank.load(Ordering::Relaxed) {
            1 => Some(Level::ERROR),
            2 => Some(Level::WARN),
            3 => Some(Level::INFO),
            4 => Some(Level::DEBUG),
            5 => Some(Level::TRACE),
            _ => None,
        }
    }

    /// Whether some subscriber wants events at `level`.
    pub fn wants(&self, level: Level) -> bool {
        level_rank(level) <= self.max_rank.load(Ordering::Relaxed)
    }

    /// Attaches a subscriber for events at `level` and above, rendered as JSON or text.
    pub fn subscribe(self: &Arc<Self>, level: Level, json: bool) -> Result<Subscription, SubscribeError> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let sub = Arc::new(Subscriber { id: self.next_id.fetch_add(1, Ordering::Relaxed), level, json, tx, dropped: AtomicU64::new(0) });
        {
            let mut subs = self.subscribers.lock().unwrap_or_else(|e| e.into_inner());
            if subs.len() >= MAX_SUBSCRIBERS {
                return Err(SubscribeError::TooMany(subs.len()));
            }
            subs.push(sub.clone());
        }
        self.levels_changed();
        Ok(Subscription { hub: self.clone(), sub, rx })
    }

    fn unsubscribe(&self, id: u64) {
        self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).retain(|s| s.id != id);
        self.levels_changed();
    }

    /// Recomputes the most verbose level wanted and, when it changed, tells tracing to ask its
    /// filters again (outside the lock: that calls back into the filter).
    fn levels_changed(&self) {
        let rank = self.subscribers.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|s| level_rank(s.level)).max().unwrap_or(0);
        if self.max_rank.swap(rank, Ordering::Relaxed) != rank {
            tracing::callsite::rebuild_interest_cache();
        }
    }

    /// Offers one event to every subscriber that wants `level`; `render(json)` gives its line
    /// (called at most once per format). A full queue drops the line and counts it.
    pub fn publish(&self, level: Level, render: &dyn Fn(bool) -> String) {
        if !self.wants(level) {
            return;
        }
        let subs: Vec<Arc<Subscriber>> = self
            .subscribers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|s| level_rank(level) <= level_rank(s.level))
            .cloned()
            .collect();
        let (mut text, mut json) = (None, None);
        for sub in subs {
            let slot = if sub.json { &mut json } else { &mut text };
            let line = slot.get_or_insert_with(|| bounded_line(render(sub.json))).clone();
            if sub.tx.try_send(line).is_err() {
                sub.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// `line` cut to [`MAX_LINE_BYTES`] (on a character boundary), ending with one newline.
fn bounded_line(mut line: String) -> Bytes {
    if line.len() > MAX_LINE_BYTES {
        let mut cut = MAX_LINE_BYTES;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    if !line.ends_with('\n') {
        line.push('\n');
    }
    Bytes::from(line)
}

/// One monitor's lines; detaches when dropped.
pub struct Subscription {
    hub: Arc<LogHub>,
    sub: Arc<Subscriber>,
    rx: mpsc::Receiver<Bytes>,
}

impl Subscription {
    /// The next line: first Nomad's notice of lines dropped since the last read, if any.
    pub async fn next_line(&mut self) -> Option<Bytes> {
        if let Some(notice) = self.dropped_notice() {
            return Some(notice);
        }
        self.rx.recv().await
    }

    /// A line already queued, without waiting (the dropped notice first).
    pub fn try_next_line(&mut self) -> Option<Bytes> {
        self.dropped_notice().or_else(|| self.rx.try_recv().ok())
    }

    fn dropped_notice(&self) -> Option<Bytes> {
        let dropped = self.sub.dropped.swap(0, Ordering::Relaxed);
        (dropped > 0).then(|| Bytes::from(format!("[WARN] Monitor dropped {dropped} logs during monitor request\n")))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.hub.unsubscribe(self.sub.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn subscribers_get_their_levels_and_formats() {
        let hub = Arc::new(LogHub::default());
        assert!(!hub.wants(Level::ERROR), "nothing is wanted with no subscriber");
        let mut info = hub.subscribe(Level::INFO, false).unwrap();
        let mut debug_json = hub.subscribe(Level::DEBUG, true).unwrap();
        assert_eq!(hub.max_level(), Some(Level::DEBUG));
        let renders = std::sync::atomic::AtomicUsize::new(0);
        let render = |json: bool| {
            renders.fetch_add(1, Ordering::Relaxed);
            if json { "{\"@message\":\"m\"}".to_string() } else { "text m".to_string() }
        };
        hub.publish(Level::DEBUG, &render);
        hub.publish(Level::INFO, &render);
        assert_eq!(renders.load(Ordering::Relaxed), 3, "one JSON render per event, text only for the info one");
        assert_eq!(info.try_next_line().unwrap(), "text m\n");
        assert!(info.try_next_line().is_none(), "the debug event is not the info subscriber's");
        assert_eq!(debug_json.next_line().await.unwrap(), "{\"@message\":\"m\"}\n");
        assert_eq!(debug_json.next_line().await.unwrap(), "{\"@message\":\"m\"}\n");
        drop(debug_json);
        assert_eq!(hub.max_level(), Some(Level::INFO), "a dropped subscription detaches");
        drop(info);
        assert_eq!(hub.max_level(), None);
    }

    #[tokio::test]
    async fn a_slow_reader_loses_lines_not_memory_and_is_told() {
        let hub = Arc::new(LogHub::default());
        let mut sub = hub.subscribe(Level::INFO, false).unwrap();
        let extra = 100;
        for i in 0..SUBSCRIBER_BUFFER + extra {
            hub.publish(Level::INFO, &|_| format!("line {i}"));
        }
        assert_eq!(sub.next_line().await.unwrap(), format!("[WARN] Monitor dropped {extra} logs during monitor request\n"));
        let mut kept = 0;
        while let Some(line) = sub.try_next_line() {
            assert_eq!(line, format!("line {kept}\n"), "the oldest lines are kept, in order");
            kept += 1;
        }
        assert_eq!(kept, SUBSCRIBER_BUFFER);
    }

    #[test]
    fn long_lines_are_cut_and_subscribers_are_bounded() {
        let line = bounded_line("é".repeat(MAX_LINE_BYTES));
        assert!(line.len() <= MAX_LINE_BYTES + 1 && line.ends_with(b"\n"));
        let hub = Arc::new(LogHub::default());
        let subs: Vec<_> = (0..MAX_SUBSCRIBERS).map(|_| hub.subscribe(Level::INFO, false).unwrap()).collect();
        assert_eq!(hub.subscribe(Level::INFO, false).err(), Some(SubscribeError::TooMany(MAX_SUBSCRIBERS)));
        drop(subs);
        assert!(hub.subscribe(Level::INFO, false).is_ok());
    }
}
