//! The agent's metrics, gathered when asked (`GET /v1/metrics`), in go-metrics' shapes.
//!
//! Nomad keeps an in-memory sink that every subsystem pushes into and shows the current 10 s
//! interval of it. nomad-rs has no sink: each role registers a [`MetricsSource`] that reads the
//! figures it already holds (alloc runners, the state store, the broker, Raft's metrics) into a
//! [`MetricsSnapshot`] at request time, so an idle agent spends nothing on metrics. Only what is
//! measured is reported: a figure nomad-rs does not have is left out, never reported as zero.
//!
//! [`MetricsSnapshot::to_json`] is go-metrics' `MetricsSummary` (`Timestamp`, `Gauges`,
//! `Points`, `Counters`, `Samples`), [`MetricsSnapshot::to_prometheus`] the text exposition
//! format (dots in names become underscores, as the Prometheus sink does).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use serde_json::{Value, json};

/// Adds what a role knows to the snapshot being built.
pub type MetricsSource = Arc<dyn Fn(&mut MetricsSnapshot) + Send + Sync>;

/// One gauge: a value now.
#[derive(Debug, Clone, PartialEq)]
pub struct Gauge {
    /// Dotted name (`nomad.client.allocations.running`).
    pub name: String,
    /// The value.
    pub value: f64,
    /// Labels, sorted by name.
    pub labels: BTreeMap<String, String>,
}

/// Aggregated observations (go-metrics' `SampledValue`): counters and timings.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// Dotted name.
    pub name: String,
    /// Observations.
    pub count: u64,
    /// Their sum.
    pub sum: f64,
    /// Sum of squares (for the standard deviation; not shown).
    pub sum_sq: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Labels, sorted by name.
    pub labels: BTreeMap<String, String>,
}

impl Sampled {
    /// The aggregate of `values`.
    pub fn of(name: &str, values: &[f64], labels: &[(&str, &str)]) -> Sampled {
        let mut s = Sampled {
            name: name.to_string(),
            count: 0,
            sum: 0.0,
            sum_sq: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            labels: label_map(labels),
        };
        for v in values {
            s.count += 1;
            s.sum += v;
            s.sum_sq += v * v;
            s.min = s.min.min(*v);
            s.max = s.max.max(*v);
        }
        if s.count == 0 {
            (s.min, s.max) = (0.0, 0.0);
        }
        s
    }

    fn mean(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.sum / self.count as f64 }
    }

    /// The sample standard deviation, as go-metrics computes it.
    fn stddev(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let n = self.count as f64;
        let variance = (self.sum_sq - self.sum * self.sum / n) / (n - 1.0);
        variance.max(0.0).sqrt()
    }
}

/// What the agent reports now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsSnapshot {
    /// Gauges.
    pub gauges: Vec<Gauge>,
    /// Counters.
    pub counters: Vec<Sampled>,
    /// Timings and other samples.
    pub samples: Vec<Sampled>,
    /// Labels every gauge carries (go-metrics adds `host` to gauges only).
    pub gauge_labels: BTreeMap<String, String>,
}

fn label_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

impl MetricsSnapshot {
    /// A snapshot whose gauges carry `host` (go-metrics' hostname label).
    pub fn new(host: &str) -> MetricsSnapshot {
        let mut gauge_labels = BTreeMap::new();
        if !host.is_empty() {
            gauge_labels.insert("host".to_string(), host.to_string());
        }
        MetricsSnapshot { gauge_labels, ..Default::default() }
    }

    /// Builds a snapshot from every source.
    pub fn gather(host: &str, sources: &[MetricsSource]) -> MetricsSnapshot {
        let mut snapshot = MetricsSnapshot::new(host);
        for source in sources {
            source(&mut snapshot);
        }
        snapshot.gauges.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.labels.cmp(&b.labels)));
        snapshot.counters.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.labels.cmp(&b.labels)));
        snapshot.samples.sort_by(|a, b| a.name.cmp(&b.name).then_with(|| a.labels.cmp(&b.labels)));
        snapshot
    }

    /// Sets a gauge.
    pub fn gauge(&mut self, name: &str, value: f64, labels: &[(&str, &str)]) {
        let mut all = self.gauge_labels.clone();
        all.extend(label_map(labels));
        self.gauges.push(Gauge { name: name.to_string(), value, labels: all });
    }

    /// Adds a counter.
    pub fn counter(&mut self, counter: Sampled) {
        self.counters.push(counter);
    }

    /// Adds a sample.
    pub fn sample(&mut self, sample: Sampled) {
        self.samples.push(sample);
    }

    /// go-metrics' `MetricsSummary`; `timestamp` is Go's `time.Time` text of the interval.
    pub fn to_json(&self, timestamp: &str) -> Value {
        let gauges: Vec<Value> =
            self.gauges.iter().map(|g| json!({ "Name": g.name, "Value": number(g.value), "Labels": g.labels })).collect();
        let sampled = |s: &Sampled| {
            let rate = s.sum / SAMPLE_INTERVAL_SECS;
            json!({
                "Name": s.name,
                "Count": s.count,
                "Rate": number(rate),
                "Sum": number(s.sum),
                "Min": number(s.min),
                "Max": number(s.max),
                "Mean": number(s.mean()),
                "Stddev": number(s.stddev()),
                "Labels": s.labels,
            })
        };
        json!({
            "Timestamp": timestamp,
            "Gauges": gauges,
            "Points": [],
            "Counters": self.counters.iter().map(sampled).collect::<Vec<_>>(),
            "Samples": self.samples.iter().map(sampled).collect::<Vec<_>>(),
        })
    }

    /// The Prometheus text exposition format: gauges as `gauge`, counters as `counter` (their
    /// sum), samples as `summary` (`_sum` and `_count`).
    pub fn to_prometheus(&self) -> String {
        let mut out = String::new();
        let typed = |out: &mut String, name: &str, kind: &str| {
            let _ = writeln!(out, "# HELP {name} {name}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
        };
        let mut last = String::new();
        for g in &self.gauges {
            let name = prometheus_name(&g.name);
            if name != last {
                typed(&mut out, &name, "gauge");
                last.clone_from(&name);
            }
            let _ = writeln!(out, "{name}{} {}", prometheus_labels(&g.labels), prometheus_value(g.value));
        }
        for c in &self.counters {
            let name = prometheus_name(&c.name);
            if name != last {
                typed(&mut out, &name, "counter");
                last.clone_from(&name);
            }
            let _ = writeln!(out, "{name}{} {}", prometheus_labels(&c.labels), prometheus_value(c.sum));
        }
        for s in &self.samples {
            let name = prometheus_name(&s.name);
            if name != last {
                typed(&mut out, &name, "summary");
                last.clone_from(&name);
            }
            let labels = prometheus_labels(&s.labels);
            let _ = writeln!(out, "{name}_sum{labels} {}", prometheus_value(s.sum));
            let _ = writeln!(out, "{name}_count{labels} {}", s.count);
        }
        out
    }
}

/// go-metrics aggregates over 10 s intervals; `Rate` is per second of one.
const SAMPLE_INTERVAL_SECS: f64 = 10.0;

/// A JSON number as Go prints a float: integral values without a fraction.
fn number(v: f64) -> Value {
    if v.is_finite() && v.fract() == 0.0 && v.abs() < 9.0e15 { json!(v as i64) } else { json!(v) }
}

/// A metric name as Prometheus allows it: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn prometheus_name(name: &str) -> String {
    let mut out: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == ':' { c } else { '_' }).collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

fn prometheus_labels(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| {
            let escaped = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
            format!("{}=\"{escaped}\"", prometheus_name(k))
        })
        .collect();
    format!("{{{}}}", pairs.join(","))
}

fn prometheus_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else if v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Go's `time.Time.String()` of the start of the current 10 s interval, in UTC
/// (`2023-08-01 12:34:50 +0000 UTC`), as go-metrics' `Timestamp`.
pub fn interval_timestamp(now: std::time::SystemTime) -> String {
    let secs = now.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let start = secs - secs % 10;
    let t = nomad_proto::Timestamp::from_unix_nanos(i64::try_from(start).unwrap_or(0).saturating_mul(1_000_000_000));
    let rfc = t.to_rfc3339();
    // `2023-08-01T12:34:50Z` → `2023-08-01 12:34:50 +0000 UTC`.
    let (date, rest) = rfc.split_once('T').unwrap_or((&rfc, ""));
    let clock: String = rest.chars().take(8).collect();
    format!("{date} {clock} +0000 UTC")
}

/// This process's resident set in bytes and its thread count, from `/proc/self/status`
/// (Linux). `None` where it cannot be read.
pub fn process_figures() -> Option<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |key: &str| {
        status.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse::<u64>().ok())
    };
    Some((field("VmRSS:")? * 1024, field("Threads:")?))
}

/// The agent's own figures: resident memory, threads, and the async tasks alive on the
/// runtime the caller runs on (nomad-rs' counterpart of goroutines).
pub fn runtime_source() -> MetricsSource {
    Arc::new(|m: &mut MetricsSnapshot| {
        if let Some((rss, threads)) = process_figures() {
            m.gauge("nomad.runtime.rss_bytes", rss as f64, &[]);
            m.gauge("nomad.runtime.num_threads", threads as f64, &[]);
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            m.gauge("nomad.runtime.num_tasks", handle.metrics().num_alive_tasks() as f64, &[]);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_go_metrics_shape() {
        let mut m = MetricsSnapshot::new("h1");
        m.gauge("nomad.client.allocations.running", 2.0, &[("node_id", "n1")]);
        m.counter(Sampled::of("nomad.http.requests", &[1.0, 1.0, 1.0], &[]));
        m.sample(Sampled::of("nomad.plan.apply", &[2.0, 4.0], &[("kind", "x")]));
        let v = m.to_json("2023-08-01 12:34:50 +0000 UTC");
        assert_eq!(v["Timestamp"], "2023-08-01 12:34:50 +0000 UTC");
        assert_eq!(
            v["Gauges"][0],
            json!({"Name": "nomad.client.allocations.running", "Value": 2, "Labels": {"host": "h1", "node_id": "n1"}})
        );
        assert_eq!(v["Points"], json!([]));
        assert_eq!(v["Counters"][0]["Count"], 3);
        assert_eq!(v["Counters"][0]["Labels"], json!({}), "go-metrics labels gauges only with the host");
        let s = &v["Samples"][0];
        assert_eq!((s["Count"].as_u64(), s["Sum"].as_i64(), s["Min"].as_i64(), s["Max"].as_i64()), (Some(2), Some(6), Some(2), Some(4)));
        assert_eq!(s["Mean"], 3);
        assert!((s["Stddev"].as_f64().unwrap() - std::f64::consts::SQRT_2).abs() < 1e-9);
        assert_eq!(s["Labels"], json!({"kind": "x"}));
    }

    #[test]
    fn prometheus_text_exposition() {
        let mut m = MetricsSnapshot::new("h1");
        m.gauge("nomad.client.allocations.running", 2.0, &[("node_id", "n\"1")]);
        m.gauge("nomad.client.allocations.running", 0.5, &[("node_id", "n2")]);
        m.sample(Sampled::of("nomad.plan.apply", &[2.0, 4.0], &[]));
        let text = m.to_prometheus();
        assert_eq!(
            text,
            "# HELP nomad_client_allocations_running nomad_client_allocations_running\n\
             # TYPE nomad_client_allocations_running gauge\n\
             nomad_client_allocations_running{host=\"h1\",node_id=\"n\\\"1\"} 2\n\
             nomad_client_allocations_running{host=\"h1\",node_id=\"n2\"} 0.5\n\
             # HELP nomad_plan_apply nomad_plan_apply\n\
             # TYPE nomad_plan_apply summary\n\
             nomad_plan_apply_sum 6\n\
             nomad_plan_apply_count 2\n"
        );
    }

    #[test]
    fn interval_timestamp_is_gos_time_string_rounded_to_ten_seconds() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_690_893_297);
        assert_eq!(interval_timestamp(t), "2023-08-01 12:34:50 +0000 UTC");
    }

    #[test]
    fn the_process_reports_its_memory_and_threads() {
        let (rss, threads) = process_figures().expect("/proc/self/stat");
        assert!(rss > 1024 * 1024, "{rss}");
        assert!(threads >= 1);
    }
}
