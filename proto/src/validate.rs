//! Job validation with messages that say what is wrong (`structs.Job.Validate`).

use std::collections::BTreeMap;
use std::fmt;

use crate::job::{Job, JobType, MAX_JOB_PRIORITY, RESTART_MODE_DELAY, RESTART_MODE_FAIL, Task, TaskGroup, lifecycle_hook};
use crate::service::{SERVICE_PROVIDER_CONSUL, SERVICE_PROVIDER_NOMAD, Service};

/// Constraint operators the scheduler understands.
pub const CONSTRAINT_OPERANDS: &[&str] = &[
    "=",
    "==",
    "is",
    "!=",
    "not",
    "<",
    "<=",
    ">",
    ">=",
    "regexp",
    "version",
    "semver",
    "set_contains",
    "set_contains_all",
    "set_contains_any",
    "is_set",
    "is_not_set",
    "distinct_hosts",
    "distinct_property",
];

/// Lowest memory a task may ask for, MiB.
pub const MIN_MEMORY_MB: i64 = 10;

/// Everything wrong with a job. Displays like Go's multierror, which is what
/// Nomad's API returns with status 500.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<String>);

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        writeln!(f, "{n} error{} occurred:", if n == 1 { "" } else { "s" })?;
        for e in &self.0 {
            writeln!(f, "\t* {e}")?;
        }
        writeln!(f)
    }
}

impl std::error::Error for ValidationErrors {}

impl Job {
    /// Checks a canonicalized job. Every problem is reported, not just the first.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errs = Vec::new();
        if self.region.is_empty() {
            errs.push("Missing job region".to_string());
        }
        if self.id.is_empty() {
            errs.push("Missing job ID".to_string());
        } else if self.id.contains(' ') {
            errs.push("Job ID contains a space".to_string());
        } else if self.id.contains('\0') {
            errs.push("Job ID contains a null character".to_string());
        }
        if self.name.is_empty() {
            errs.push("Missing job name".to_string());
        } else if self.name.contains('\0') {
            errs.push("Job Name contains a null character".to_string());
        }
        if self.namespace.is_empty() {
            errs.push("Job must be in a namespace".to_string());
        }
        if self.job_type == JobType::Core {
            errs.push("Job type \"_core\" is reserved for internal jobs".to_string());
        }
        if !(1..=MAX_JOB_PRIORITY).contains(&self.priority) {
            errs.push(format!("job priority must be between [1, {MAX_JOB_PRIORITY}]"));
        }
        if self.datacenters.is_empty() {
            errs.push("Missing job datacenters".to_string());
        }
        for dc in &self.datacenters {
            if dc.is_empty() {
                errs.push("Job datacenter must be non-empty string".to_string());
            }
        }
        if self.task_groups.is_empty() {
            errs.push("Missing job task groups".to_string());
        }
        for (i, c) in self.constraints.iter().enumerate() {
            if let Err(e) = validate_constraint(c) {
                errs.push(format!("Constraint {} validation failed: {e}", i + 1));
            }
        }
        for (i, a) in self.affinities.iter().enumerate() {
            if let Err(e) = validate_affinity(a) {
                errs.push(format!("Affinity {} validation failed: {e}", i + 1));
            }
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, g) in self.task_groups.iter().enumerate() {
            if g.name.is_empty() {
                errs.push(format!("Job task group {} missing name", i + 1));
            } else if let Some(prev) = seen.insert(g.name.as_str(), i) {
                errs.push(format!("Job task group {} redefines '{}' from group {}", i + 1, g.name, prev + 1));
            }
            for e in validate_group(self, g) {
                errs.push(format!("Task group {} validation failed: {e}", display_name(&g.name, i)));
            }
        }
        if errs.is_empty() { Ok(()) } else { Err(ValidationErrors(errs)) }
    }
}

fn display_name(name: &str, i: usize) -> String {
    if name.is_empty() { format!("{}", i + 1) } else { name.to_string() }
}

fn validate_group(job: &Job, g: &TaskGroup) -> Vec<String> {
    let mut errs = Vec::new();
    if g.count < 0 {
        errs.push("Task group count can't be negative".to_string());
    }
    if g.tasks.is_empty() {
        errs.push("Missing tasks for task group".to_string());
    }
    if g.max_client_disconnect.is_some() && g.stop_after_client_disconnect.is_some() {
        errs.push("Task group cannot be configured with both max_client_disconnect and stop_after_client_disconnect".to_string());
    }
    if g.max_client_disconnect.is_some_and(|d| d < 0) {
        errs.push("max_client_disconnect cannot be negative".to_string());
    }
    if g.stop_after_client_disconnect.is_some_and(|d| d < 0) {
        errs.push("stop_after_client_disconnect must be a positive value".to_string());
    }
    if g.shutdown_delay.is_some_and(|d| d < 0) {
        errs.push("shutdown_delay must be a positive value".to_string());
    }
    if g.ephemeral_disk.size_mb < 0 {
        errs.push("ephemeral_disk size must be a positive value".to_string());
    }
    if let Some(r) = &g.restart_policy {
        if r.mode != RESTART_MODE_FAIL && r.mode != RESTART_MODE_DELAY {
            errs.push(format!("Unsupported restart mode: {:?}", r.mode));
        }
        if r.attempts < 0 {
            errs.push("restart attempts can't be negative".to_string());
        }
        if r.delay < 0 || r.interval < 0 {
            errs.push("restart delay and interval can't be negative".to_string());
        }
        if r.mode == RESTART_MODE_DELAY && r.interval > 0 && r.interval < r.delay && r.attempts > 0 {
            errs.push(format!(
                "Nomad can't restart the TaskGroup {} times in an interval of {} with a delay of {}",
                r.attempts,
                fmt_ns(r.interval),
                fmt_ns(r.delay)
            ));
        }
    }
    if let Some(r) = &g.reschedule_policy {
        if !["", "constant", "exponential", "fibonacci"].contains(&r.delay_function.as_str()) {
            errs.push(format!(
                "Invalid delay function {:?}, must be one of [\"constant\" \"exponential\" \"fibonacci\"]",
                r.delay_function
            ));
        }
        if r.attempts < 0 || r.interval < 0 || r.delay < 0 {
            errs.push("reschedule attempts, interval and delay can't be negative".to_string());
        }
        if matches!(job.job_type, JobType::System | JobType::Sysbatch) && r.enabled() {
            errs.push("System jobs should not have a reschedule policy".to_string());
        }
    }
    for (i, c) in g.constraints.iter().enumerate() {
        if let Err(e) = validate_constraint(c) {
            errs.push(format!("Constraint {} validation failed: {e}", i + 1));
        }
    }
    for (i, a) in g.affinities.iter().enumerate() {
        if let Err(e) = validate_affinity(a) {
            errs.push(format!("Affinity {} validation failed: {e}", i + 1));
        }
    }
    for (i, s) in g.spreads.iter().enumerate() {
        if s.attribute.is_empty() {
            errs.push(format!("Spread {} missing attribute", i + 1));
        }
        if !(0..=100).contains(&s.weight) {
            errs.push(format!("Spread {} weight must be within the range [0, 100]", i + 1));
        }
        let total: i64 = s.spread_target.iter().map(|t| t.percent).sum();
        if total > 100 {
            errs.push(format!("Spread {} has targets summing to {total}%, more than 100%", i + 1));
        }
    }
    let mut ports: BTreeMap<&str, ()> = BTreeMap::new();
    for n in &g.networks {
        for p in n.reserved_ports.iter().chain(n.dynamic_ports.iter()) {
            if p.label.is_empty() {
                errs.push("Port label must not be empty".to_string());
            } else if ports.insert(p.label.as_str(), ()).is_some() {
                errs.push(format!("Port label {:?} already in use", p.label));
            }
            if p.value < 0 || p.value > 65535 {
                errs.push(format!("Port {:?} has an invalid value {}", p.label, p.value));
            }
            if p.to < -1 || p.to > 65535 {
                errs.push(format!("Port {:?} cannot be mapped to {}", p.label, p.to));
            }
        }
    }
    for (name, v) in &g.volumes {
        match v.volume_type.as_str() {
            "host" | "csi" => {}
            other => errs.push(format!("Volume {name} has unrecognised type {other:?}")),
        }
        if v.source.is_empty() {
            errs.push(format!("Volume {name} has an empty source"));
        }
        if v.volume_type == "csi" {
            let modes = [
                "",
                "single-node-reader-only",
                "single-node-writer",
                "multi-node-reader-only",
                "multi-node-single-writer",
                "multi-node-multi-writer",
            ];
            if !modes.contains(&v.access_mode.as_str()) {
                errs.push(format!("Volume {name} has an invalid access mode {:?}", v.access_mode));
            }
            if !["", "file-system", "block-device"].contains(&v.attachment_mode.as_str()) {
                errs.push(format!("Volume {name} has an invalid attachment mode {:?}", v.attachment_mode));
            }
        }
    }
    for s in &g.services {
        for e in validate_service(s, g, None) {
            errs.push(format!("Service {} is invalid: {e}", s.name));
        }
    }
    let mut task_names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut leaders = 0;
    for (i, t) in g.tasks.iter().enumerate() {
        if !t.name.is_empty()
            && let Some(prev) = task_names.insert(t.name.as_str(), i)
        {
            errs.push(format!("Task {} redefines '{}' from task {}", i + 1, t.name, prev + 1));
        }
        if t.leader {
            leaders += 1;
        }
        for e in validate_task(t, g) {
            errs.push(format!("Task {} validation failed: {e}", display_name(&t.name, i)));
        }
    }
    if leaders > 1 {
        errs.push("Only one task may be marked as leader".to_string());
    }
    errs
}

fn validate_task(t: &Task, g: &TaskGroup) -> Vec<String> {
    let mut errs = Vec::new();
    if t.name.is_empty() {
        errs.push("Missing task name".to_string());
    } else if t.name.contains('/') {
        errs.push("Task name cannot include slashes".to_string());
    } else if t.name.contains('\0') {
        errs.push("Task name cannot include null characters".to_string());
    }
    if t.driver.is_empty() {
        errs.push("Missing task driver".to_string());
    }
    if t.kill_timeout < 0 {
        errs.push("KillTimeout must be a positive value".to_string());
    }
    if t.shutdown_delay < 0 {
        errs.push("ShutdownDelay must be a positive value".to_string());
    }
    let r = &t.resources;
    if r.cores == 0 && r.cpu < 1 {
        errs.push(format!("minimum CPU value is 1; got {}", r.cpu));
    }
    if r.cores < 0 {
        errs.push(format!("cores can't be negative; got {}", r.cores));
    }
    if r.memory_mb < MIN_MEMORY_MB {
        errs.push(format!("minimum MemoryMB value is {MIN_MEMORY_MB}; got {}", r.memory_mb));
    }
    if r.memory_max_mb != 0 && r.memory_max_mb < r.memory_mb {
        errs.push(format!("MemoryMaxMB value ({}) should be larger than MemoryMB value ({})", r.memory_max_mb, r.memory_mb));
    }
    if t.log_config.max_files < 1 {
        errs.push(format!("minimum number of files is 1; got {}", t.log_config.max_files));
    }
    if t.log_config.max_file_size_mb < 1 {
        errs.push(format!("minimum file size is 1MB; got {}", t.log_config.max_file_size_mb));
    }
    if let Some(l) = &t.lifecycle
        && ![lifecycle_hook::PRESTART, lifecycle_hook::POSTSTART, lifecycle_hook::POSTSTOP].contains(&l.hook.as_str())
    {
        errs.push(format!("invalid hook: {}", l.hook));
    }
    for (i, c) in t.constraints.iter().enumerate() {
        if let Err(e) = validate_constraint(c) {
            errs.push(format!("Constraint {} validation failed: {e}", i + 1));
        }
        if c.operand == "distinct_hosts" || c.operand == "distinct_property" {
            errs.push(format!("Constraint {} validation failed: {} can only be used at the job or group level", i + 1, c.operand));
        }
    }
    for (i, m) in t.volume_mounts.iter().enumerate() {
        if !g.volumes.contains_key(&m.volume) {
            errs.push(format!("Volume Mount ({i}) references undefined volume {}", m.volume));
        }
        if m.destination.is_empty() {
            errs.push(format!("Volume Mount ({i}) has an empty destination"));
        }
    }
    for s in &t.services {
        for e in validate_service(s, g, Some(t)) {
            errs.push(format!("Service {} is invalid: {e}", s.name));
        }
    }
    errs
}

fn validate_service(s: &Service, g: &TaskGroup, task: Option<&Task>) -> Vec<String> {
    let mut errs = Vec::new();
    if s.provider != SERVICE_PROVIDER_CONSUL && s.provider != SERVICE_PROVIDER_NOMAD {
        errs.push(format!("Service provider must be one of \"consul\" or \"nomad\"; got {:?}", s.provider));
    }
    if !s.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '$' || c == '{' || c == '}' || c == '.' || c == '_') {
        errs.push(format!("Service name must be valid per RFC 1123 and can contain only alphanumeric characters or dashes: {:?}", s.name));
    }
    if !s.port_label.is_empty() && s.port_label.parse::<u16>().is_err() {
        let in_group =
            g.networks.iter().flat_map(|n| n.reserved_ports.iter().chain(n.dynamic_ports.iter())).any(|p| p.label == s.port_label);
        let in_task = task.is_some_and(|t| {
            t.resources.networks.iter().flat_map(|n| n.reserved_ports.iter().chain(n.dynamic_ports.iter())).any(|p| p.label == s.port_label)
        });
        let is_connect = s.connect.is_some();
        if !in_group && !in_task && !is_connect {
            errs.push(format!("port label {:?} referenced by services {} does not exist", s.port_label, s.name));
        }
    }
    if s.provider == SERVICE_PROVIDER_NOMAD && s.connect.is_some() {
        errs.push("Service with provider nomad cannot include Connect blocks".to_string());
    }
    for c in &s.checks {
        if !["", "http", "tcp", "script", "grpc"].contains(&c.check_type.as_str()) {
            errs.push(format!("check {:?} has an unsupported type {:?}", c.name, c.check_type));
        }
        if c.check_type != "script" && c.interval <= 0 && !c.check_type.is_empty() {
            errs.push(format!("check {:?} needs an interval", c.name));
        }
    }
    errs
}

/// Checks one constraint's shape.
pub fn validate_constraint(c: &crate::Constraint) -> Result<(), String> {
    if !CONSTRAINT_OPERANDS.contains(&c.operand.as_str()) {
        return Err(format!("Unknown constraint type {:?}", c.operand));
    }
    match c.operand.as_str() {
        "distinct_hosts" => Ok(()),
        "distinct_property" => {
            if c.l_target.is_empty() {
                return Err("distinct_property requires a property".to_string());
            }
            if !c.r_target.is_empty() && c.r_target.parse::<u64>().map_or(true, |v| v == 0) {
                return Err(format!("distinct_property allowed count must be a positive integer; got {:?}", c.r_target));
            }
            Ok(())
        }
        "is_set" | "is_not_set" => {
            if c.l_target.is_empty() {
                Err("No LTarget provided but is required by constraint".to_string())
            } else {
                Ok(())
            }
        }
        "regexp" => {
            if c.l_target.is_empty() {
                return Err("No LTarget provided but is required by constraint".to_string());
            }
            if c.r_target.is_empty() { Err("regexp constraint requires a pattern".to_string()) } else { Ok(()) }
        }
        _ => {
            if c.l_target.is_empty() {
                return Err("No LTarget provided but is required by constraint".to_string());
            }
            if c.r_target.is_empty() && !c.operand.starts_with("set_contains") {
                return Err("No RTarget provided but is required by constraint".to_string());
            }
            Ok(())
        }
    }
}

fn validate_affinity(a: &crate::Affinity) -> Result<(), String> {
    // Affinities take the value operators; placement-shaping ones make no sense as a preference.
    let op = a.operand.as_str();
    if !CONSTRAINT_OPERANDS.contains(&op) || matches!(op, "distinct_hosts" | "distinct_property" | "is_set" | "is_not_set") {
        return Err(format!("Unknown affinity operator {:?}", a.operand));
    }
    if a.l_target.is_empty() {
        return Err("No LTarget provided but is required".to_string());
    }
    if a.weight == 0 || !(-100..=100).contains(&a.weight) {
        return Err(format!("Affinity weight must be within the range [-100,100] and non-zero; got {}", a.weight));
    }
    Ok(())
}

fn fmt_ns(ns: i64) -> String {
    let secs = ns as f64 / 1e9;
    if secs.fract() == 0.0 { format!("{}s", secs as i64) } else { format!("{secs}s") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lenient;

    fn job(json: &str) -> Job {
        let mut j: Job = lenient::from_slice(json.as_bytes()).unwrap();
        j.canonicalize();
        j
    }

    #[test]
    fn a_good_job_passes() {
        let j = job(r#"{"ID":"ok","TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec"}]}]}"#);
        j.validate().unwrap();
    }

    #[test]
    fn each_problem_is_named() {
        let j = job(r#"{"ID":"has space","Priority":0,"TaskGroups":[
                {"Name":"g","Count":-1,"MaxClientDisconnect":1,"StopAfterClientDisconnect":1,
                 "Tasks":[{"Name":"t","Resources":{"MemoryMB":1}}]},
                {"Name":"g","Tasks":[]}]}"#);
        let err = j.validate().unwrap_err();
        let text = err.to_string();
        for needle in [
            "Job ID contains a space",
            "job priority must be between [1, 100]",
            "Task group count can't be negative",
            "both max_client_disconnect and stop_after_client_disconnect",
            "Missing task driver",
            "minimum MemoryMB value is 10; got 1",
            "Job task group 2 redefines 'g' from group 1",
            "Missing tasks for task group",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
        }
        assert!(text.starts_with(&format!("{} errors occurred:\n\t* ", err.0.len())));
    }

    #[test]
    fn a_job_without_groups_is_refused() {
        let j = job(r#"{"ID":"empty"}"#);
        assert_eq!(j.validate().unwrap_err().0, vec!["Missing job task groups".to_string()]);
    }

    #[test]
    fn unknown_constraint_operators_are_refused() {
        let j = job(r#"{"ID":"c","Constraints":[{"LTarget":"${attr.kernel.name}","RTarget":"linux","Operand":"~="}],
            "TaskGroups":[{"Name":"g","Tasks":[{"Name":"t","Driver":"raw_exec"}]}]}"#);
        let text = j.validate().unwrap_err().to_string();
        assert!(text.contains("Unknown constraint type \"~=\""), "{text}");
    }
}
