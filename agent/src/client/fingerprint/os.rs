//! Operating system: `os.name`, `os.version` from `/etc/os-release`; `os.signals`, the signals a
//! task may be sent (what Nomad's implied `kill_signal` / `change_signal` constraint reads).

use super::{Fingerprint, FingerprintContext, Fingerprinter, read};

pub(super) struct Os;

/// (`ID`, `VERSION_ID`) from an os-release file, unquoted.
fn parse_os_release(text: &str) -> (Option<String>, Option<String>) {
    let value = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim().trim_matches(|c| c == '"' || c == '\'').to_string())
            .filter(|v| !v.is_empty())
    };
    (value("ID"), value("VERSION_ID"))
}

/// Every signal name the kernel has, `SIG` spelling, sorted and comma-separated.
fn signals() -> String {
    let mut names: Vec<&str> = nix::sys::signal::Signal::iterator().map(|s| s.as_str()).collect();
    names.sort_unstable();
    names.join(",")
}

impl Fingerprinter for Os {
    fn name(&self) -> &'static str {
        "os"
    }

    fn fingerprint(&self, _ctx: &FingerprintContext, out: &mut Fingerprint) -> Result<(), String> {
        let text = read("/etc/os-release").or_else(|_| read("/usr/lib/os-release"))?;
        let (name, version) = parse_os_release(&text);
        if let Some(name) = name {
            out.attributes.insert("os.name".into(), name);
        }
        if let Some(version) = version {
            out.attributes.insert("os.version".into(), version);
        }
        out.attributes.insert("os.signals".into(), signals());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_listed_in_sig_spelling() {
        let s = signals();
        let names: Vec<&str> = s.split(',').collect();
        for want in ["SIGHUP", "SIGINT", "SIGKILL", "SIGTERM", "SIGUSR1", "SIGUSR2"] {
            assert!(names.contains(&want), "{want} in {s}");
        }
        assert!(names.windows(2).all(|w| w[0] < w[1]), "sorted, no duplicates: {s}");
    }

    #[test]
    fn os_release_id_and_version() {
        let text = "NAME=\"Ubuntu\"\nVERSION_ID=\"22.04\"\nID=ubuntu\nID_LIKE=debian\n";
        assert_eq!(parse_os_release(text), (Some("ubuntu".into()), Some("22.04".into())));
        assert_eq!(parse_os_release("NAME=x\n"), (None, None));
    }
}
