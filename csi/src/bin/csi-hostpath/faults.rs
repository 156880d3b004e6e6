//! Failure injection for negative tests: every call slowed by `--slow MS`, and
//! `--fail-times METHOD=N` making the first N calls of METHOD fail with UNAVAILABLE.

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
    failures_left: Mutex<HashMap<&'static str, u64>>,
}

impl Faults {
    /// From the flags; an unknown method or a malformed count is an error naming it.
    pub fn from_flags(slow_ms: u64, fail_times: &[String]) -> Result<Faults, String> {
        if slow_ms > MAX_SLOW_MS {
            return Err(format!("--slow {slow_ms}: at most {MAX_SLOW_MS} ms"));
        }
        let mut failures_left = HashMap::new();
        for spec in fail_times {
            let (method, count) = spec.split_once('=').ok_or_else(|| format!("--fail-times {spec:?}: expected METHOD=N"))?;
            let method = METHODS
                .iter()
                .copied()
                .find(|m| *m == method)
                .ok_or_else(|| format!("--fail-times {spec:?}: unknown method {method:?} (one of {})", METHODS.join(", ")))?;
            let count: u64 = count.parse().map_err(|_| format!("--fail-times {spec:?}: {count:?} is not a count"))?;
            if failures_left.insert(method, count).is_some() {
                return Err(format!("--fail-times: {method} given twice"));
            }
        }
        Ok(Faults { slow: Duration::from_millis(slow_ms), failures_left: Mutex::new(failures_left) })
    }

    /// Called first by every RPC: waits `--slow`, then fails if failures of `method` are left.
    pub async fn enter(&self, method: &'static str) -> Result<(), Status> {
        if !self.slow.is_zero() {
            tokio::time::sleep(self.slow).await;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_method_fails_its_count_then_succeeds() {
        let faults = Faults::from_flags(0, &["NodePublishVolume=2".to_string()]).unwrap();
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
        let err = |slow, specs: &[&str]| Faults::from_flags(slow, &specs.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap_err();
        assert!(err(0, &["NodePublish=1"]).contains("unknown method \"NodePublish\""));
        assert!(err(0, &["Probe"]).contains("expected METHOD=N"));
        assert!(err(0, &["Probe=-1"]).contains("\"-1\" is not a count"));
        assert!(err(0, &["Probe=1", "Probe=2"]).contains("Probe given twice"));
        assert!(err(MAX_SLOW_MS + 1, &[]).contains("--slow"));
    }
}
