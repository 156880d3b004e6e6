//! Linux capabilities of a task: Nomad's rule for which a task gets (`allow_caps` in the driver's
//! plugin config, `cap_add`/`cap_drop` in the task's), shared by every driver that isolates.
//!
//! Names are accepted in any case, with or without `CAP_`, and `"all"` means every capability the
//! kernel has. A set is a bit mask by capability number, which is what the kernel takes.

use std::fmt;

/// Capability names by number (`include/uapi/linux/capability.h`), lower case without `cap_`.
const NAMES: [&str; 41] = [
    "chown",
    "dac_override",
    "dac_read_search",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "linux_immutable",
    "net_bind_service",
    "net_broadcast",
    "net_admin",
    "net_raw",
    "ipc_lock",
    "ipc_owner",
    "sys_module",
    "sys_rawio",
    "sys_chroot",
    "sys_ptrace",
    "sys_pacct",
    "sys_admin",
    "sys_boot",
    "sys_nice",
    "sys_resource",
    "sys_time",
    "sys_tty_config",
    "mknod",
    "lease",
    "audit_write",
    "audit_control",
    "setfcap",
    "mac_override",
    "mac_admin",
    "syslog",
    "wake_alarm",
    "block_suspend",
    "audit_read",
    "perfmon",
    "bpf",
    "checkpoint_restore",
];

/// What Nomad gives a task by default (and the default `allow_caps`): Docker's default set
/// without `net_raw`.
pub const NOMAD_DEFAULTS: &[&str] = &[
    "audit_write",
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "mknod",
    "net_bind_service",
    "setfcap",
    "setgid",
    "setpcap",
    "setuid",
    "sys_chroot",
];

/// The last capability a task running as root got before `allow_caps` existed (`audit_read`):
/// Nomad keeps that set for exec tasks run as root so those clusters keep working.
const LEGACY_LAST: u32 = 37;

/// A set of capabilities, by number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapSet(u64);

/// A capability name the kernel does not have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownCapabilities(pub Vec<String>);

impl fmt::Display for UnknownCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(", "))
    }
}

fn normalize(name: &str) -> String {
    let lower = name.trim().to_ascii_lowercase();
    lower.strip_prefix("cap_").map(str::to_string).unwrap_or(lower)
}

impl CapSet {
    /// Every capability up to and including `last` (the kernel's `cap_last_cap`).
    pub fn up_to(last: u32) -> CapSet {
        let last = last.min(NAMES.len() as u32 - 1);
        CapSet(if last >= 63 { u64::MAX } else { (1u64 << (last + 1)) - 1 })
    }

    /// The set Nomad keeps for root exec tasks, limited to what the kernel has.
    pub fn legacy(supported: CapSet) -> CapSet {
        CapSet::up_to(LEGACY_LAST).intersect(supported)
    }

    /// Parses names; `"all"` is `supported`. Names the kernel does not have are returned as the error.
    pub fn parse<S: AsRef<str>>(names: &[S], supported: CapSet) -> Result<CapSet, UnknownCapabilities> {
        let mut set = CapSet::default();
        let mut unknown = Vec::new();
        for raw in names {
            match normalize(raw.as_ref()).as_str() {
                "" => {}
                "all" => set = set.union(supported),
                name => match NAMES.iter().position(|n| *n == name) {
                    Some(bit) if supported.contains(bit as u32) => set.0 |= 1 << bit,
                    _ => unknown.push(name.to_string()),
                },
            }
        }
        if unknown.is_empty() { Ok(set) } else { Err(UnknownCapabilities(unknown)) }
    }

    /// Whether capability number `bit` is in the set.
    pub fn contains(self, bit: u32) -> bool {
        bit < 64 && self.0 & (1 << bit) != 0
    }

    /// Both sets.
    pub fn union(self, other: CapSet) -> CapSet {
        CapSet(self.0 | other.0)
    }

    /// What both sets have.
    pub fn intersect(self, other: CapSet) -> CapSet {
        CapSet(self.0 & other.0)
    }

    /// What `self` has and `other` does not.
    pub fn minus(self, other: CapSet) -> CapSet {
        CapSet(self.0 & !other.0)
    }

    /// The mask, bit n for capability n (the kernel's representation).
    pub fn bits(self) -> u64 {
        self.0
    }

    /// Names, sorted, lower case without `cap_` (Nomad's messages).
    pub fn names(self) -> Vec<&'static str> {
        let mut names: Vec<&str> = (0..NAMES.len()).filter(|b| self.contains(*b as u32)).map(|b| NAMES[b]).collect();
        names.sort_unstable();
        names
    }
}

/// The capabilities this agent can give a task: those the kernel has
/// (`/proc/sys/kernel/cap_last_cap`; without it, up to `block_suspend`, as Nomad assumes for old
/// kernels) that the agent itself holds (its permitted set: a sandboxed host may withhold some,
/// and a task can never get more than the executor that starts it).
pub fn supported() -> CapSet {
    let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap").ok().and_then(|s| s.trim().parse::<u32>().ok());
    let kernel = CapSet::up_to(last.unwrap_or(36));
    let held = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| status.lines().find_map(|l| l.strip_prefix("CapPrm:")).and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok()));
    match held {
        Some(mask) => kernel.intersect(CapSet(mask)),
        None => kernel,
    }
}

/// Nomad's rule (`capabilities.Calculate`): start from the defaults that the driver's
/// `allow_caps` also allows, remove the task's `cap_drop` (`"all"` removes everything), then add
/// its `cap_add`, which must all be allowed. `cap_add` wins over `cap_drop`, so
/// `cap_drop = ["all"]` with `cap_add = ["chown"]` gives only `chown`.
pub fn calculate<S: AsRef<str>>(allow: CapSet, cap_add: &[S], cap_drop: &[S], supported: CapSet) -> Result<CapSet, String> {
    let unsupported = |what: &str, e: UnknownCapabilities| format!("{what} configured with capabilities not supported by system: {e}");
    let add = CapSet::parse(cap_add, supported).map_err(|e| unsupported("cap_add", e))?;
    let drop = CapSet::parse(cap_drop, supported).map_err(|e| unsupported("cap_drop", e))?;
    let not_allowed = add.minus(allow);
    if not_allowed != CapSet::default() {
        return Err(format!("driver does not allow the following capabilities: {}", not_allowed.names().join(", ")));
    }
    let defaults = CapSet::parse(NOMAD_DEFAULTS, supported).unwrap_or_default();
    Ok(defaults.intersect(allow).minus(drop).union(add))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> CapSet {
        CapSet::parse(names, CapSet::up_to(40)).unwrap()
    }

    #[test]
    fn names_are_read_in_any_case_with_or_without_the_prefix() {
        let all = CapSet::up_to(40);
        assert_eq!(set(&["CAP_CHOWN", "net_raw", " Kill "]).names(), vec!["chown", "kill", "net_raw"]);
        assert_eq!(CapSet::parse(&["all"], all).unwrap(), all);
        let err = CapSet::parse(&["chown", "cap_flying", "bpf"], CapSet::up_to(36)).unwrap_err();
        assert_eq!(err.to_string(), "flying, bpf", "a capability newer than the kernel is unknown too");
        assert_eq!(CapSet::up_to(40).bits(), (1 << 41) - 1);
        assert_eq!(CapSet::legacy(CapSet::up_to(40)), CapSet::up_to(37));
        assert_eq!(CapSet::legacy(CapSet::up_to(35)), CapSet::up_to(35));
    }

    /// The rule of Nomad's `capabilities.Calculate` (drivers/shared/capabilities/defaults.go, v1.6.1).
    #[test]
    fn calculate_follows_nomads_rule() {
        let all = CapSet::up_to(40);
        let defaults = set(NOMAD_DEFAULTS);
        let none: [&str; 0] = [];
        // Nothing asked: the defaults.
        assert_eq!(calculate(defaults, &none, &none, all).unwrap(), defaults);
        // allow_caps narrower than the defaults narrows the result.
        assert_eq!(calculate(set(&["chown", "kill"]), &none, &none, all).unwrap(), set(&["chown", "kill"]));
        // Dropping everything and adding back one.
        assert_eq!(calculate(defaults, &["chown"], &["all"], all).unwrap(), set(&["chown"]));
        // A drop of one default.
        assert_eq!(calculate(defaults, &none, &["kill"], all).unwrap(), defaults.minus(set(&["kill"])));
        // Adding one the driver allows beyond the defaults.
        let allow = defaults.union(set(&["net_raw"]));
        assert_eq!(calculate(allow, &["net_raw"], &none, all).unwrap(), defaults.union(set(&["net_raw"])));
        // Adding one it does not allow.
        assert_eq!(
            calculate(defaults, &["net_raw", "sys_admin"], &none, all).unwrap_err(),
            "driver does not allow the following capabilities: net_raw, sys_admin"
        );
        assert_eq!(
            calculate(defaults, &none, &["cap_nonsense"], all).unwrap_err(),
            "cap_drop configured with capabilities not supported by system: nonsense"
        );
    }
}
