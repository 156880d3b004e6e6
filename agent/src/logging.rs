//! Structured logs on stderr, and the same events for `/v1/agent/monitor`.
//!
//! Two layers share the events: stderr's, filtered at the agent's level (or `NOMAD_RS_LOG`),
//! and the monitor layer, filtered at the most verbose level an attached monitor asked for
//! (`nomad_server::log_hub::LogHub`), so `nomad-rs monitor -log-level debug` sees debug lines
//! of an agent logging at info. With no monitor attached the monitor filter wants nothing, and
//! the hub has tracing re-ask the filters whenever that changes, so it costs nothing then.

use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::Arc;

use nomad_server::log_hub::LogHub;
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::DefaultFields;
use tracing_subscriber::layer::{Context, Filter, Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Crates whose debug output is their own plumbing: logged from `warn` only, on stderr and to
/// monitors alike.
const QUIET_CRATES: &[&str] = &["openraft", "h2", "tower", "hyper"];

/// Sets up logging at `level`; `NOMAD_RS_LOG` (an env-filter directive) overrides it. Colors
/// only on a terminal: a log file or the journal gets plain text (and `NO_COLOR` turns them off).
pub fn init(level: &str) {
    let quiet: String = QUIET_CRATES.iter().map(|c| format!(",{c}=warn")).collect();
    let filter = std::env::var("NOMAD_RS_LOG")
        .ok()
        .and_then(|d| EnvFilter::try_new(d).ok())
        .unwrap_or_else(|| EnvFilter::new(format!("{}{quiet}", level.to_lowercase())));
    let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_ansi(colors()).with_target(false).with_filter(filter);
    let hub = LogHub::global().clone();
    let monitor = MonitorLayer { hub: hub.clone() }.with_filter(MonitorFilter { hub });
    let _ = tracing_subscriber::registry().with(stderr).with(monitor).try_init();
}

/// Whether log lines may carry ANSI colors: stderr is a terminal and `NO_COLOR` is not set.
fn colors() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Wants what some monitor wants (the quiet crates from `warn` only).
struct MonitorFilter {
    hub: Arc<LogHub>,
}

impl MonitorFilter {
    fn wants(&self, meta: &Metadata<'_>) -> bool {
        let level = *meta.level();
        if QUIET_CRATES.iter().any(|c| meta.target() == *c || meta.target().starts_with(&format!("{c}::"))) && level > tracing::Level::WARN
        {
            return false;
        }
        self.hub.wants(level)
    }
}

impl<S> Filter<S> for MonitorFilter {
    fn enabled(&self, meta: &Metadata<'_>, _cx: &Context<'_, S>) -> bool {
        self.wants(meta)
    }

    fn callsite_enabled(&self, meta: &'static Metadata<'static>) -> Interest {
        // The hub rebuilds the interest cache when monitors come and go, so this may be fixed.
        if self.wants(meta) { Interest::always() } else { Interest::never() }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.hub.max_level().map_or(LevelFilter::OFF, LevelFilter::from_level))
    }
}

/// Renders events for the hub: hclog's text (`2023-08-01T12:34:56.789Z [INFO]  message: k=v`)
/// or its JSON (`{"@level","@message","@timestamp",...}`).
struct MonitorLayer {
    hub: Arc<LogHub>,
}

/// An event's message and fields.
#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(String, serde_json::Value)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, serde_json::Value::String(value.to_string()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, serde_json::Value::String(format!("{value:?}")));
    }
}

impl Fields {
    fn put(&mut self, field: &Field, value: serde_json::Value) {
        if field.name() == "message" {
            self.message = match value {
                serde_json::Value::String(s) => s,
                v => v.to_string(),
            };
        } else {
            self.pairs.push((field.name().to_string(), value));
        }
    }
}

impl<S> Layer<S> for MonitorLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let level = *event.metadata().level();
        let mut fields = Fields::default();
        event.record(&mut fields);
        // The spans the event happened in, with the fields stderr's layer formatted for them.
        let mut scope = String::new();
        if let Some(spans) = ctx.event_scope(event) {
            for span in spans.from_root() {
                scope.push_str(span.name());
                if let Some(f) = span.extensions().get::<FormattedFields<DefaultFields>>().filter(|f| !f.is_empty()) {
                    let _ = write!(scope, "{{{f}}}");
                }
                scope.push_str(": ");
            }
        }
        let nanos = nomad_proto::time::now_unix_nanos();
        self.hub
            .publish(level, &|json| if json { json_line(level, nanos, &scope, &fields) } else { text_line(level, nanos, &scope, &fields) });
    }
}

/// `2023-08-01T12:34:56` and the fraction of the second in `digits` digits.
fn timestamp(nanos: i64, digits: u32) -> String {
    let secs = nanos.div_euclid(1_000_000_000);
    let whole = nomad_proto::Timestamp::from_unix_nanos(secs * 1_000_000_000).to_rfc3339();
    let fraction = nanos.rem_euclid(1_000_000_000) / 10i64.pow(9 - digits);
    format!("{}.{fraction:0width$}Z", whole.trim_end_matches('Z'), width = digits as usize)
}

fn text_line(level: tracing::Level, nanos: i64, scope: &str, fields: &Fields) -> String {
    let tag = format!("[{}]", level.as_str());
    let mut line = format!("{} {tag:<8}{scope}{}", timestamp(nanos, 3), fields.message);
    if !fields.pairs.is_empty() {
        line.push(':');
        for (k, v) in &fields.pairs {
            let text = match v {
                serde_json::Value::String(s) if s.is_empty() || s.contains(char::is_whitespace) || s.contains('"') => {
                    serde_json::to_string(s).unwrap_or_default()
                }
                serde_json::Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            let _ = write!(line, " {k}={text}");
        }
    }
    line
}

fn json_line(level: tracing::Level, nanos: i64, scope: &str, fields: &Fields) -> String {
    let mut o = serde_json::Map::new();
    o.insert("@level".into(), level.as_str().to_ascii_lowercase().into());
    o.insert("@message".into(), format!("{scope}{}", fields.message).into());
    o.insert("@timestamp".into(), timestamp(nanos, 6).into());
    for (k, v) in &fields.pairs {
        o.insert(k.clone(), v.clone());
    }
    serde_json::Value::Object(o).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Fields {
        Fields {
            message: "alloc started".into(),
            pairs: vec![("alloc_id".into(), "a1".into()), ("reason".into(), "two words".into()), ("n".into(), 3.into())],
        }
    }

    #[test]
    fn text_lines_look_like_hclogs() {
        let nanos = 1_690_893_296_789_123_456;
        assert_eq!(
            text_line(tracing::Level::INFO, nanos, "task{name=web}: ", &sample()),
            "2023-08-01T12:34:56.789Z [INFO]  task{name=web}: alloc started: alloc_id=a1 reason=\"two words\" n=3"
        );
        assert_eq!(
            text_line(tracing::Level::ERROR, nanos, "", &Fields { message: "x".into(), pairs: vec![] }),
            "2023-08-01T12:34:56.789Z [ERROR] x"
        );
    }

    #[test]
    fn json_lines_look_like_hclogs() {
        let v: serde_json::Value =
            serde_json::from_str(&json_line(tracing::Level::DEBUG, 1_690_893_296_000_001_000, "", &sample())).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"@level": "debug", "@message": "alloc started", "@timestamp": "2023-08-01T12:34:56.000001Z",
                "alloc_id": "a1", "reason": "two words", "n": 3})
        );
    }

    /// The two layers on a subscriber of the test's own (not the process's global one).
    #[test]
    fn a_monitor_sees_debug_events_below_the_agents_level_only_while_attached() {
        let hub = Arc::new(LogHub::default());
        let stderr = tracing_subscriber::fmt::layer().with_writer(std::io::sink).with_filter(EnvFilter::new("info"));
        let monitor = MonitorLayer { hub: hub.clone() }.with_filter(MonitorFilter { hub: hub.clone() });
        let subscriber = tracing_subscriber::registry().with(stderr).with(monitor);
        tracing::subscriber::with_default(subscriber, || {
            let mut sub = hub.subscribe(tracing::Level::DEBUG, false).unwrap();
            tracing::debug!(alloc_id = "a1", "placing");
            tracing::trace!("too verbose");
            tracing::debug!(target: "h2::codec", "a frame");
            let line = sub.try_next_line().expect("the debug event reaches the monitor");
            let line = String::from_utf8(line.to_vec()).unwrap();
            assert!(line.contains("[DEBUG] placing: alloc_id=a1\n"), "{line}");
            assert!(sub.try_next_line().is_none(), "trace and the quiet crates' debug are not sent");
            drop(sub);
            tracing::info!("after");
            assert!(!hub.wants(tracing::Level::ERROR));
        });
    }
}
