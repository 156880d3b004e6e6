//! Failure injection for negative tests: every call slowed by `--slow MS`, the calls of one
//! method by `--slow-call METHOD=MS` (logged when the call starts, so a test can kill the plugin
//! in the middle of it), and `--fail-times METHOD=N` making the first N calls of METHOD fail with
//! UNAVAILABLE.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tonic::Status;

/// Every RPC of the three services, by its gRPC method name.
pub const METHODS: &[&str] = &[
    "GetPluginInfo",
    "GetPluginCapabilities",
    "Probe",
    "CreateVolume",
    "DeleteVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ValidateVolumeCapabilities",
    "ListVolumes",
    "GetCapacity",
    "ControllerGetCapabilities",
    "CreateSnapshot",
    "DeleteSnapshot",
    "ListSnapshots",
    "ControllerExpandVolume",
    "ControllerGetVolume",
    "NodeStageVolume",
    "NodeUnstageVolume",
    "NodePublishVolume",
    "NodeUnpublishVolume",
    "NodeGetVolumeStats",
    "NodeExpandVolume",
    "NodeGetCapabilities",
    "NodeGetInfo",
];

/// The longest `--slow` (an hour): longer is a typo, not a test.
const MAX_SLOW_MS: u64 = 3_600_000;

/// The injected faults and how many failures are left.
#[derive(Debug, Default)]
pub struct Faults {
    slow: Duration,
    slow_calls: HashMap<&'static str, Duration>,
    failures_left: Mutex<HashMap<&'static str, u64>>,
}

impl Faults {
    /// From the flags; an unknown method or a malformed count is an error naming it.
    pub fn from_flags(slow_ms: u64, slow_calls: &[String], fail_times: &[String]) -> Result<Faults, String> {
        if slow_ms > MAX_SLOW_MS {
            return Err(format!("--slow {slow_ms}: at most {MAX_SLOW_MS} ms"));
        }
        let mut delays = HashMap::new();
        for (method, ms) in method_counts("--slow-call", "METHOD=MS", slow_calls)? {
            if ms > MAX_SLOW_MS {
                return Err(format!("--slow-call {method}={ms}: at most {MAX_SLOW_MS} ms"));
            }
            delays.insert(method, Duration::from_millis(ms));
        }
        let failures_left = method_counts("--fail-times", "METHOD=N", fail_times)?.into_iter().collect();
        Ok(Faults { slow: Duration::from_millis(slow_ms), slow_calls: delays, failures_left: Mutex::new(failures_left) })
    }

    /// Called first by every RPC: waits `--slow` (or the method's `--slow-call`), then fails if
    /// failures of `method` are left.
    pub async fn enter(&self, method: &'static str) -> Result<(), Status> {
        let delay = match self.slow_calls.get(method) {
            Some(delay) => {
                tracing::info!(method, delay_ms = delay.as_millis() as u64, "slow call started (--slow-call)");
                *delay
            }
            None => self.slow,
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut failures_left = self.failures_left.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match failures_left.get_mut(method) {
            Some(left) if *left > 0 => {
                *left -= 1;
                // Logged by the caller with the method, like every failure.
                Err(Status::unavailable(format!("injected failure of {method} (--fail-times), {} more to come", *left)))
            }
            _ => Ok(()),
        }
    }
}

/// `METHOD=NUMBER` flags: each method known and given once.
fn method_counts(flag: &str, form: &str, specs: &[String]) -> Result<Vec<(&'static str, u64)>, String> {
    let mut out: Vec<(&'static str, u64)> = Vec::with_capacity(specs.len());
    for spec in specs {
        let (method, count) = spec.split_once('=').ok_or_else(|| format!("{flag} {spec:?}: expected {form}"))?;
        let method = METHODS
            .iter()
            .copied()
            .find(|m| *m == method)
            .ok_or_else(|| format!("{flag} {spec:?}: unknown method {method:?} (one of {})", METHODS.join(", ")))?;
        let count: u64 = count.parse().map_err(|_| format!("{flag} {spec:?}: {count:?} is not a count"))?;
        if out.iter().any(|(m, _)| *m == method) {
            return Err(format!("{flag}: {method} given twice"));
        }
        out.push((method, count));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_method_fails_its_count_then_succeeds() {
        let faults = Faults::from_flags(0, &[], &["NodePublishVolume=2".to_string()]).unwrap();
        for left in [1, 0] {
            let err = faults.enter("NodePublishVolume").await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unavailable);
            assert!(err.message().contains(&format!("{left} more to come")), "{}", err.message());
        }
        assert!(faults.enter("NodePublishVolume").await.is_ok());
        assert!(faults.enter("Probe").await.is_ok(), "other methods are untouched");
    }

    #[test]
    fn bad_flags_are_named() {
        let strings = |specs: &[&str]| specs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let err = |slow, specs: &[&str]| Faults::from_flags(slow, &[], &strings(specs)).unwrap_err();
        assert!(err(0, &["NodePublish=1"]).contains("unknown method \"NodePublish\""));
        assert!(err(0, &["Probe"]).contains("expected METHOD=N"));
        assert!(err(0, &["Probe=-1"]).contains("\"-1\" is not a count"));
        assert!(err(0, &["Probe=1", "Probe=2"]).contains("Probe given twice"));
        assert!(err(MAX_SLOW_MS + 1, &[]).contains("--slow"));
        let slow_err = |specs: &[&str]| Faults::from_flags(0, &strings(specs), &[]).unwrap_err();
        assert!(slow_err(&["Probe"]).contains("--slow-call \"Probe\": expected METHOD=MS"), "{}", slow_err(&["Probe"]));
        assert!(slow_err(&["Probe=3600001"]).contains("at most 3600000 ms"));
        assert!(slow_err(&["Probe=1", "Probe=2"]).contains("--slow-call: Probe given twice"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_call_delays_only_its_method() {
        let faults = Faults::from_flags(0, &["NodeUnpublishVolume=5000".to_string()], &[]).unwrap();
        let start = tokio::time::Instant::now();
        faults.enter("Probe").await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO);
        faults.enter("NodeUnpublishVolume").await.unwrap();
        assert!(start.elapsed() >= Duration::from_secs(5), "{:?}", start.elapsed());
    }
}
