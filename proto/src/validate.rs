//! Job and node validation with Nomad's messages (`structs.Job.Validate` and the `Validate`
//! of each block, `Node.Register`'s checks).
//!
//! Where Nomad accepts a value that would escape a directory, make an object unaddressable
//! over HTTP or reach a terminal raw, a rule of ours refuses it; each is marked `(ours)` with
//! its reason. Sizes and counts are checked before this, in [`crate::limits`].

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::job::{
    Job, JobType, MAX_JOB_PRIORITY, MigrateStrategy, PeriodicConfig, RESTART_MODE_DELAY, RESTART_MODE_FAIL, ReschedulePolicy,
    RestartPolicy, Spread, Task, TaskGroup, UpdateStrategy, lifecycle_hook,
};
use crate::limits::MAX_RESOURCE_VALUE;
use crate::node::Node;
use crate::service::{SERVICE_PROVIDER_CONSUL, SERVICE_PROVIDER_NOMAD, Service, ServiceCheck};

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

/// Lowest memory a task may ask for, MiB (Nomad's `MinResources`).
pub const MIN_MEMORY_MB: i64 = 10;
/// Lowest CPU a task may ask for, MHz (Nomad's `MinResources`).
pub const MIN_CPU_MHZ: i64 = 1;
/// Smallest ephemeral disk, MiB (Nomad's `EphemeralDisk.Validate`).
pub const MIN_DISK_MB: i64 = 10;
/// Longest job ID or job name, bytes (ours; Nomad has none).
pub const MAX_JOB_ID_BYTES: usize = 512;
/// Longest group or task name, bytes (ours: a task name is a directory name, `NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;
/// Longest node ID or secret, bytes (ours; Nomad's clients send UUIDs).
pub const MAX_NODE_ID_BYTES: usize = 128;
/// Longest reserved host port list of a node, bytes (ours).
pub const MAX_RESERVED_PORTS_BYTES: usize = 4096;

const SECOND: i64 = 1_000_000_000;
/// Nomad's `RestartPolicyMinInterval`.
const RESTART_MIN_INTERVAL: i64 = 5 * SECOND;
/// Nomad's `ReschedulePolicyMinInterval`.
const RESCHEDULE_MIN_INTERVAL: i64 = 15 * SECOND;
/// Nomad's `ReschedulePolicyMinDelay`.
const RESCHEDULE_MIN_DELAY: i64 = 5 * SECOND;

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

/// A character that must never reach a terminal raw: Unicode control characters (C0, DEL,
/// C1: newlines, escape sequences) and the bidirectional overrides and isolates, which make
/// text display as something it is not.
pub fn is_unsafe_char(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every unsafe character but those in `keep` written as an escape (`\n`, `\t`,
/// `\r`, `\u{1b}`), so it can be shown on a terminal as it is.
pub fn escape_unsafe_chars<'a>(s: &'a str, keep: &[char]) -> Cow<'a, str> {
    if !s.chars().any(|c| is_unsafe_char(c) && !keep.contains(&c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            c if !is_unsafe_char(c) || keep.contains(&c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
        }
    }
    Cow::Owned(out)
}

fn has_unsafe(s: &str) -> bool {
    s.chars().any(is_unsafe_char)
}

/// A user-given name as it appears inside a message: unsafe characters escaped.
fn shown(s: &str) -> Cow<'_, str> {
    escape_unsafe_chars(s, &[])
}

impl Job {
    /// Checks a canonicalized job. Every problem is reported, not just the first.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errs = Vec::new();
        if self.region.is_empty() {
            errs.push("Missing job region".to_string());
        } else if has_unsafe(&self.region) {
            errs.push("Job region contains a control character".to_string());
        }
        if self.id.is_empty() {
            errs.push("Missing job ID".to_string());
        } else if self.id.contains(' ') {
            errs.push("Job ID contains a space".to_string());
        } else if self.id.contains('\0') {
            errs.push("Job ID contains a null character".to_string());
        } else if has_unsafe(&self.id) {
            // (ours) IDs are printed by every CLI and log line that names the job.
            errs.push("Job ID contains a control character".to_string());
        } else if self.id.len() > MAX_JOB_ID_BYTES {
            errs.push(format!("Job ID is longer than {MAX_JOB_ID_BYTES} bytes"));
        } else if self.id.split('/').any(|seg| seg.is_empty() || seg == "." || seg == "..") {
            // (ours) Nomad's HTTP layer cleans paths (`//`, `.`, `..`) before it reads the
            // ID from them, so such a job could be registered but never read or stopped.
            errs.push("Job ID cannot start or end with '/', or have an empty, \".\" or \"..\" segment".to_string());
        }
        if self.name.is_empty() {
            errs.push("Missing job name".to_string());
        } else if self.name.contains('\0') {
            errs.push("Job Name contains a null character".to_string());
        } else if has_unsafe(&self.name) {
            errs.push("Job Name contains a control character".to_string());
        } else if self.name.len() > MAX_JOB_ID_BYTES {
            errs.push(format!("Job Name is longer than {MAX_JOB_ID_BYTES} bytes"));
        }
        if self.namespace.is_empty() {
            errs.push("Job must be in a namespace".to_string());
        }
        if !self.node_pool.is_empty()
            && let Err(e) = validate_node_pool_name(&self.node_pool)
        {
            errs.push(format!("invalid node pool: {e}"));
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
            } else if has_unsafe(dc) {
                errs.push(format!("Job datacenter {:?} contains a control character", dc));
            }
        }
        if self.task_groups.is_empty() {
            errs.push("Missing job task groups".to_string());
        }
        validate_meta("Job", &self.meta, &mut errs);
        for (i, c) in self.constraints.iter().enumerate() {
            for e in validate_constraint(c) {
                errs.push(format!("Constraint {} validation failed: {e}", i + 1));
            }
        }
        let system = self.job_type == JobType::System;
        if system && !self.affinities.is_empty() {
            errs.push("System jobs may not have an affinity block".to_string());
        } else {
            for (i, a) in self.affinities.iter().enumerate() {
                for e in validate_affinity(a) {
                    errs.push(format!("Affinity {} validation failed: {e}", i + 1));
                }
            }
        }
        if system && !self.spreads.is_empty() {
            errs.push("System jobs may not have a spread block".to_string());
        } else {
            for (i, s) in self.spreads.iter().enumerate() {
                for e in validate_spread(s) {
                    errs.push(format!("Spread {} validation failed: {e}", i + 1));
                }
            }
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, g) in self.task_groups.iter().enumerate() {
            if g.name.is_empty() {
                errs.push(format!("Job task group {} missing name", i + 1));
            } else if let Some(prev) = seen.insert(g.name.as_str(), i) {
                errs.push(format!("Job task group {} redefines '{}' from group {}", i + 1, shown(&g.name), prev + 1));
            }
            if system && g.count > 1 {
                errs.push(format!("Job task group {} has count {}. Count cannot exceed 1 with system scheduler", shown(&g.name), g.count));
            }
            for e in validate_group(self, g) {
                errs.push(format!("Task group {} validation failed: {e}", display_name(&g.name, i)));
            }
        }
        if let Some(p) = &self.periodic
            && p.enabled
        {
            if !matches!(self.job_type, JobType::Batch | JobType::Sysbatch) {
                errs.push("Periodic can only be used with \"batch\" or \"sysbatch\" scheduler".to_string());
            }
            errs.extend(validate_periodic(p));
        }
        if let Some(p) = &self.parameterized_job {
            if !matches!(self.job_type, JobType::Batch | JobType::Sysbatch) {
                errs.push("Parameterized job can only be used with \"batch\" or \"sysbatch\" scheduler".to_string());
            }
            if !["optional", "required", "forbidden"].contains(&p.payload.as_str()) {
                errs.push(format!("Unknown payload requirement: {:?}", &p.payload));
            }
            let optional: BTreeSet<&String> = p.meta_optional.iter().collect();
            let both: Vec<String> = p.meta_required.iter().filter(|k| optional.contains(k)).map(|k| shown(k).into_owned()).collect();
            if !both.is_empty() {
                errs.push(format!(
                    "Required and optional meta keys should be disjoint. Following keys exist in both: [{}]",
                    both.join(" ")
                ));
            }
        }
        if errs.is_empty() { Ok(()) } else { Err(ValidationErrors(errs)) }
    }
}

fn display_name(name: &str, i: usize) -> String {
    if name.is_empty() { format!("{}", i + 1) } else { shown(name).into_owned() }
}

/// Nomad's rule for node pool names.
fn validate_node_pool_name(pool: &str) -> Result<(), String> {
    let ok = (1..=128).contains(&pool.len()) && pool.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok { Ok(()) } else { Err(format!("invalid name {:?}, must match regex ^[a-zA-Z0-9-_]{{1,128}}$", pool)) }
}

/// Meta keys are interpolated (`${meta.key}`) and exported (`NOMAD_META_<key>`); values are
/// exported too. Nomad checks neither; the rules here are ours.
fn validate_meta(owner: &str, meta: &BTreeMap<String, String>, errs: &mut Vec<String>) {
    for (k, v) in meta {
        if k.is_empty() {
            errs.push(format!("{owner} meta key must not be empty"));
        } else if k.contains('\0') {
            errs.push(format!("{owner} meta key {:?} contains a null character", k));
        } else if has_unsafe(k) {
            errs.push(format!("{owner} meta key {:?} contains a control character", k));
        }
        if v.contains('\0') {
            errs.push(format!("{owner} meta value of {:?} contains a null character", k));
        }
    }
}

/// The name rules of groups and tasks (`what` is `Task group` or `Task`).
fn validate_name(what: &str, name: &str, errs: &mut Vec<String>) {
    if name.is_empty() {
        return;
    }
    if name.contains('\0') {
        // Nomad's wording for each.
        errs.push(if what == "Task" {
            "Task name cannot include null characters".to_string()
        } else {
            "Task group name contains null character".to_string()
        });
    } else if has_unsafe(name) {
        errs.push(format!("{what} name contains a control character"));
    }
    if name.contains(['/', '\\']) {
        // Nomad's rule for tasks (a task name is a directory name); ours for groups, whose
        // names go into alloc names and the client's paths and logs.
        errs.push(format!("{what} name cannot include slashes"));
    }
    if name == "." || name == ".." {
        // (ours) A task dir named `..` is the node's alloc root.
        errs.push(format!("{what} name cannot be {name:?}"));
    }
    if name.len() > MAX_NAME_BYTES {
        errs.push(format!("{what} name is longer than {MAX_NAME_BYTES} bytes"));
    }
}

fn validate_group(job: &Job, g: &TaskGroup) -> Vec<String> {
    let mut errs = Vec::new();
    validate_name("Task group", &g.name, &mut errs);
    if g.count < 0 {
        errs.push("Task group count can't be negative".to_string());
    }
    if g.tasks.is_empty() {
        errs.push("Missing tasks for task group".to_string());
    }
    validate_meta("Task group", &g.meta, &mut errs);
    if g.max_client_disconnect.is_some() && g.stop_after_client_disconnect.is_some() {
        errs.push("Task group cannot be configured with both max_client_disconnect and stop_after_client_disconnect".to_string());
    }
    if g.max_client_disconnect.is_some_and(|d| d < 0) {
        errs.push("max_client_disconnect cannot be negative".to_string());
    }
    match g.stop_after_client_disconnect {
        Some(d) if d < 0 => errs.push("stop_after_client_disconnect must be a positive value".to_string()),
        Some(d) if d > 0 && !matches!(job.job_type, JobType::Batch | JobType::Service) => {
            errs.push("stop_after_client_disconnect can only be set in batch and service jobs".to_string())
        }
        _ => {}
    }
    if g.shutdown_delay.is_some_and(|d| d < 0) {
        errs.push("ShutdownDelay must be a positive value".to_string());
    }
    if g.ephemeral_disk.size_mb < MIN_DISK_MB {
        errs.push(format!("minimum DiskMB value is {MIN_DISK_MB}; got {}", g.ephemeral_disk.size_mb));
    } else if g.ephemeral_disk.size_mb > MAX_RESOURCE_VALUE {
        errs.push(format!("maximum DiskMB value is {MAX_RESOURCE_VALUE}; got {}", g.ephemeral_disk.size_mb));
    }
    match &g.restart_policy {
        Some(r) => errs.extend(validate_restart(r)),
        None => errs.push(format!("Task Group {} should have a restart policy", shown(&g.name))),
    }
    let system = job.job_type == JobType::System;
    if let Some(r) = &g.reschedule_policy {
        if system {
            errs.push("System jobs should not have a reschedule policy".to_string());
        } else if job.job_type == JobType::Sysbatch && r.enabled() {
            // (ours) sysbatch allocs are never rescheduled; a policy that says otherwise would be ignored.
            errs.push("System jobs should not have a reschedule policy".to_string());
        } else {
            errs.extend(validate_reschedule(r));
        }
    }
    if let Some(p) = &g.scaling {
        errs.extend(p.validate_for_group(g));
    }
    if let Some(u) = &g.update {
        if !matches!(job.job_type, JobType::Service | JobType::System) {
            errs.push(format!("Job type {:?} does not allow update block", job.job_type.as_str()));
        }
        errs.extend(validate_update(u));
    }
    if let Some(m) = &g.migrate {
        if job.job_type == JobType::Service {
            errs.extend(validate_migrate(m));
        } else {
            errs.push(format!("Job type {:?} does not allow migrate block", job.job_type.as_str()));
        }
    }
    for (i, c) in g.constraints.iter().enumerate() {
        for e in validate_constraint(c) {
            errs.push(format!("Constraint {} validation failed: {e}", i + 1));
        }
    }
    if system && !g.affinities.is_empty() {
        errs.push("System jobs may not have an affinity block".to_string());
    } else {
        for (i, a) in g.affinities.iter().enumerate() {
            for e in validate_affinity(a) {
                errs.push(format!("Affinity {} validation failed: {e}", i + 1));
            }
        }
    }
    if system && !g.spreads.is_empty() {
        errs.push("System jobs may not have a spread block".to_string());
    } else {
        for (i, s) in g.spreads.iter().enumerate() {
            for e in validate_spread(s) {
                errs.push(format!("Spread {} validation failed: {e}", i + 1));
            }
        }
    }
    let mut ports: BTreeMap<&str, ()> = BTreeMap::new();
    for n in &g.networks {
        if n.mbits < 0 || n.mbits > MAX_RESOURCE_VALUE {
            errs.push(format!("network MBits must be between 0 and {MAX_RESOURCE_VALUE}; got {}", n.mbits));
        }
        for p in n.reserved_ports.iter().chain(n.dynamic_ports.iter()) {
            if p.label.is_empty() {
                errs.push("Port label must not be empty".to_string());
            } else if ports.insert(p.label.as_str(), ()).is_some() {
                errs.push(format!("Port label {:?} already in use", &p.label));
            }
            if p.value < 0 || p.value > 65535 {
                errs.push(format!("Port {:?} has an invalid value {}", &p.label, p.value));
            }
            if p.to < -1 || p.to > 65535 {
                errs.push(format!("Port {:?} cannot be mapped to {}", &p.label, p.to));
            }
        }
    }
    for (name, v) in &g.volumes {
        let name = shown(name);
        match v.volume_type.as_str() {
            "host" | "csi" => {}
            other => errs.push(format!("Volume {name} has unrecognised type {:?}", other)),
        }
        if v.source.is_empty() {
            errs.push(format!("Volume {name} has an empty source"));
        }
        if v.per_alloc {
            if matches!(job.job_type, JobType::System | JobType::Sysbatch) {
                errs.push(format!("Volume {name} cannot be per_alloc for system or sysbatch jobs"));
            }
            // A canary takes the name, so the volume, of the alloc it will replace.
            if g.update.as_ref().or(job.update.as_ref()).is_some_and(|u| u.canary > 0) {
                errs.push(format!("Volume {name} cannot be per_alloc when canaries are in use"));
            }
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
                errs.push(format!("Volume {name} has an invalid access mode {:?}", &v.access_mode));
            }
            if !["", "file-system", "block-device"].contains(&v.attachment_mode.as_str()) {
                errs.push(format!("Volume {name} has an invalid attachment mode {:?}", &v.attachment_mode));
            }
        }
    }
    for s in &g.services {
        for e in validate_service(s, g, None) {
            errs.push(format!("Service {} is invalid: {e}", shown(&s.name)));
        }
    }
    let mut task_names: BTreeMap<&str, usize> = BTreeMap::new();
    let mut leaders = 0;
    for (i, t) in g.tasks.iter().enumerate() {
        if !t.name.is_empty()
            && let Some(prev) = task_names.insert(t.name.as_str(), i)
        {
            errs.push(format!("Task {} redefines '{}' from task {}", i + 1, shown(&t.name), prev + 1));
        }
        if t.leader {
            leaders += 1;
        }
        for e in validate_task(job, t, g) {
            errs.push(format!("Task {} validation failed: {e}", display_name(&t.name, i)));
        }
    }
    if leaders > 1 {
        errs.push("Only one task may be marked as leader".to_string());
    }
    errs
}

fn validate_restart(r: &RestartPolicy) -> Vec<String> {
    let mut errs = Vec::new();
    if r.mode != RESTART_MODE_FAIL && r.mode != RESTART_MODE_DELAY {
        errs.push(format!("Unsupported restart mode: {:?}", &r.mode));
    }
    if r.attempts < 0 {
        errs.push("restart attempts can't be negative".to_string());
    } else if r.attempts == 0 && r.mode != RESTART_MODE_FAIL {
        errs.push(format!("Restart policy {:?} with {} attempts is ambiguous", &r.mode, r.attempts));
    }
    if r.delay < 0 {
        errs.push("restart delay can't be negative".to_string());
    }
    if r.interval < RESTART_MIN_INTERVAL {
        errs.push(format!("Interval can not be less than {} (got {})", go_duration(RESTART_MIN_INTERVAL), go_duration(r.interval)));
    }
    // i128: attempts and delay are both caller-chosen i64s.
    if i128::from(r.attempts) * i128::from(r.delay) > i128::from(r.interval) {
        errs.push(format!(
            "Nomad can't restart the TaskGroup {} times in an interval of {} with a delay of {}",
            r.attempts,
            go_duration(r.interval),
            go_duration(r.delay)
        ));
    }
    errs
}

fn validate_reschedule(r: &ReschedulePolicy) -> Vec<String> {
    let mut errs = Vec::new();
    if r.attempts < 0 || r.interval < 0 || r.delay < 0 || r.max_delay < 0 {
        errs.push("reschedule attempts, interval, delay and max delay can't be negative".to_string());
        return errs;
    }
    // Nomad checks a policy only when it reschedules at all.
    if !(r.attempts > 0 || r.unlimited) {
        return errs;
    }
    if r.attempts > 0 {
        if r.interval <= 0 {
            errs.push("Interval must be a non zero value if Attempts > 0".to_string());
        }
        if r.unlimited {
            errs.push(format!(
                "Reschedule Policy with Attempts = {}, Interval = {}, and Unlimited = {} is ambiguous",
                r.attempts,
                go_duration(r.interval),
                r.unlimited
            ));
            errs.push("If Attempts >0, Unlimited cannot also be set to true".to_string());
        }
    }
    let mut delays_ok = true;
    if r.delay < RESCHEDULE_MIN_DELAY {
        errs.push(format!("Delay cannot be less than {} (got {})", go_duration(RESCHEDULE_MIN_DELAY), go_duration(r.delay)));
        delays_ok = false;
    }
    if !["constant", "exponential", "fibonacci"].contains(&r.delay_function.as_str()) {
        errs.push(format!("Invalid delay function {:?}, must be one of [\"constant\" \"exponential\" \"fibonacci\"]", &r.delay_function));
        delays_ok = false;
    }
    if r.delay_function != "constant" {
        if r.max_delay < RESCHEDULE_MIN_DELAY {
            // Nomad's message shows the delay here, not the max delay.
            errs.push(format!("Max Delay cannot be less than {} (got {})", go_duration(RESCHEDULE_MIN_DELAY), go_duration(r.delay)));
            delays_ok = false;
        }
        if r.max_delay < r.delay {
            errs.push(format!("Max Delay cannot be less than Delay {} (got {})", go_duration(r.delay), go_duration(r.max_delay)));
            delays_ok = false;
        }
    }
    if !r.unlimited {
        if r.interval < RESCHEDULE_MIN_INTERVAL {
            errs.push(format!("Interval cannot be less than {} (got {})", go_duration(RESCHEDULE_MIN_INTERVAL), go_duration(r.interval)));
        }
        if delays_ok && let Some((possible, recommended)) = unviable_attempts(r) {
            if r.delay_function == "constant" {
                errs.push(format!(
                    "Nomad can only make {possible} attempts in {} with initial delay {} and delay function {:?}",
                    go_duration(r.interval),
                    go_duration(r.delay),
                    r.delay_function
                ));
            } else {
                errs.push(format!(
                    "Nomad can only make {possible} attempts in {} with initial delay {}, delay function {:?}, and delay ceiling {}",
                    go_duration(r.interval),
                    go_duration(r.delay),
                    r.delay_function,
                    go_duration(r.max_delay)
                ));
            }
            errs.push(format!(
                "Set the interval to at least {} to accommodate {} attempts",
                go_duration(round_to_second(recommended)),
                r.attempts
            ));
        }
    }
    errs
}

/// Nomad's `viableAttempts`, in closed form so a huge `attempts` costs nothing: `None` when
/// `attempts` reschedules fit in `interval`, else how many do and the interval they need.
/// Delays are at least 5 s and `max_delay >= delay` (checked before).
fn unviable_attempts(r: &ReschedulePolicy) -> Option<(i128, i128)> {
    let (attempts, interval, delay, max_delay) =
        (i128::from(r.attempts), i128::from(r.interval), i128::from(r.delay), i128::from(r.max_delay));
    match r.delay_function.as_str() {
        "constant" => {
            let needed = attempts * delay;
            (interval < needed).then(|| (interval / delay, needed))
        }
        "exponential" => {
            // The i-th attempt (from 0) is planned at 2^i * delay until that passes max_delay;
            // after that each one adds max_delay to the last.
            let at = |i: i128| -> i128 {
                let mut doubling = delay;
                let mut k = 0;
                while k < i && doubling * 2 <= max_delay {
                    doubling *= 2;
                    k += 1;
                }
                if k == i { doubling } else { doubling + (i - k) * max_delay }
            };
            let needed = at(attempts - 1);
            if needed < interval {
                return None;
            }
            // The count of attempts planned before `interval` (the plan is non-decreasing).
            let (mut lo, mut hi) = (0i128, attempts);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if at(mid) < interval { lo = mid + 1 } else { hi = mid }
            }
            Some((lo, needed))
        }
        "fibonacci" => {
            // Slots: delay, delay, then each the sum of the two before until that passes
            // max_delay, which it becomes; after that each adds max_delay to the last.
            let slot = |i: i128| -> i128 {
                if i < 2 {
                    return delay;
                }
                // Slots i-2 and i-1 while below the ceiling; the sums at least double every
                // two steps, so this ends within about a hundred steps.
                let (mut a, mut b) = (delay, delay);
                let mut k = 2;
                loop {
                    let next = a + b;
                    if next > max_delay {
                        return max_delay + (i - k) * max_delay;
                    }
                    if k == i {
                        return next;
                    }
                    (a, b, k) = (b, next, k + 1);
                }
            };
            let last = (attempts - 1).max(1);
            let needed = slot(last);
            if interval >= needed {
                return None;
            }
            // The first slot past `interval` (slots never decrease).
            let (mut lo, mut hi) = (0i128, last);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if slot(mid) > interval { hi = mid } else { lo = mid + 1 }
            }
            let possible = lo;
            Some((possible, needed))
        }
        _ => None,
    }
}

fn round_to_second(ns: i128) -> i128 {
    let s = i128::from(SECOND);
    (ns + s / 2).div_euclid(s) * s
}

fn validate_update(u: &UpdateStrategy) -> Vec<String> {
    let mut errs = Vec::new();
    if !["checks", "task_states", "manual"].contains(&u.health_check.as_str()) {
        errs.push(format!("Invalid health check given: {:?}", &u.health_check));
    }
    if u.max_parallel < 0 {
        errs.push(format!("Max parallel can not be less than zero: {} < 0", u.max_parallel));
    }
    if u.canary < 0 {
        errs.push(format!("Canary count can not be less than zero: {} < 0", u.canary));
    }
    if u.canary == 0 && u.auto_promote {
        errs.push("Auto Promote requires a Canary count greater than zero".to_string());
    }
    if u.min_healthy_time < 0 {
        errs.push(format!("Minimum healthy time may not be less than zero: {}", go_duration(u.min_healthy_time)));
    }
    if u.healthy_deadline <= 0 {
        errs.push(format!("Healthy deadline must be greater than zero: {}", go_duration(u.healthy_deadline)));
    }
    if u.progress_deadline < 0 {
        errs.push(format!("Progress deadline must be zero or greater: {}", go_duration(u.progress_deadline)));
    }
    if u.min_healthy_time >= u.healthy_deadline {
        errs.push(format!(
            "Minimum healthy time must be less than healthy deadline: {} > {}",
            go_duration(u.min_healthy_time),
            go_duration(u.healthy_deadline)
        ));
    }
    if u.progress_deadline != 0 && u.healthy_deadline >= u.progress_deadline {
        errs.push(format!(
            "Healthy deadline must be less than progress deadline: {} > {}",
            go_duration(u.healthy_deadline),
            go_duration(u.progress_deadline)
        ));
    }
    if u.stagger <= 0 {
        errs.push(format!("Stagger must be greater than zero: {}", go_duration(u.stagger)));
    }
    errs
}

fn validate_migrate(m: &MigrateStrategy) -> Vec<String> {
    let mut errs = Vec::new();
    if m.max_parallel < 0 {
        errs.push(format!("MaxParallel must be >= 0 but found {}", m.max_parallel));
    }
    match m.health_check.as_str() {
        "checks" | "task_states" => {}
        "" if m.max_parallel > 0 => errs.push("Missing HealthCheck".to_string()),
        "" => {}
        other => errs.push(format!("Invalid HealthCheck: {:?}", other)),
    }
    if m.min_healthy_time < 0 {
        errs.push(format!("MinHealthyTime is {} and must be >= 0", go_duration(m.min_healthy_time)));
    }
    if m.healthy_deadline < 0 {
        errs.push(format!("HealthyDeadline is {} and must be >= 0", go_duration(m.healthy_deadline)));
    }
    if m.min_healthy_time > m.healthy_deadline {
        errs.push("MinHealthyTime must be less than HealthyDeadline".to_string());
    }
    errs
}

fn validate_periodic(p: &PeriodicConfig) -> Vec<String> {
    let mut errs = Vec::new();
    let specs: Vec<&String> = std::iter::once(&p.spec).filter(|s| !s.is_empty()).chain(p.specs.iter()).collect();
    if specs.is_empty() {
        errs.push("Must specify a spec".to_string());
    }
    if !p.time_zone.is_empty() && (has_unsafe(&p.time_zone) || p.time_zone.starts_with('/') || p.time_zone.split('/').any(|s| s == "..")) {
        // What Go's `time.LoadLocation` refuses before it looks anything up; whether the zone
        // exists depends on the tz database of the server that launches the job.
        errs.push(format!("Invalid time zone {:?}: time: invalid location name", &p.time_zone));
    }
    match p.spec_type.as_str() {
        "cron" => {
            for spec in specs {
                if let Err(e) = crate::cron::validate_cron(spec) {
                    errs.push(format!("Invalid cron spec {:?}: {e}", spec));
                }
            }
        }
        "_internal_test" => {}
        other => errs.push(format!("Unknown periodic specification type {:?}", other)),
    }
    errs
}

fn validate_task(job: &Job, t: &Task, g: &TaskGroup) -> Vec<String> {
    let mut errs = Vec::new();
    if t.name.is_empty() {
        errs.push("Missing task name".to_string());
    }
    validate_name("Task", &t.name, &mut errs);
    if t.name == "alloc" {
        // (ours) `<alloc dir>/alloc` is the directory the alloc's tasks share.
        errs.push("Task name cannot be \"alloc\": it is the alloc's shared directory".to_string());
    }
    if t.driver.is_empty() {
        errs.push("Missing task driver".to_string());
    }
    if t.kill_timeout < 0 {
        errs.push("KillTimeout must be a positive value".to_string());
    } else if job.job_type == JobType::Service
        && let Some(u) = &g.update
        && u.progress_deadline > 0
        && t.kill_timeout > u.progress_deadline
    {
        // Nomad's spelling.
        errs.push(format!(
            "KillTimout ({}) longer than the group's ProgressDeadline ({})",
            go_duration(t.kill_timeout),
            go_duration(u.progress_deadline)
        ));
    }
    if t.shutdown_delay < 0 {
        errs.push("ShutdownDelay must be a positive value".to_string());
    }
    if let Some(c) = &t.csi_plugin_config {
        if c.id.is_empty() {
            errs.push("CSIPluginConfig must have a non-empty PluginID".to_string());
        } else if c.id == "." || c.id == ".." || c.id.contains('/') || c.id.contains('\0') {
            // (ours) The client keeps the plugin's staging dir at `csi/<type>/<id>`.
            errs.push(format!("CSIPluginConfig PluginID {:?} must be usable as a directory name", c.id));
        }
        if !matches!(c.plugin_type.as_str(), "node" | "controller" | "monolith") {
            errs.push(format!("CSIPluginConfig PluginType must be one of 'node', 'controller', or 'monolith', got: \"{}\"", c.plugin_type));
        }
    }
    errs.extend(crate::connect::validate_proxy_task(t, g));
    validate_meta("Task", &t.meta, &mut errs);
    validate_resources(t, &mut errs);
    if t.log_config.max_files < 1 {
        errs.push(format!("minimum number of files is 1; got {}", t.log_config.max_files));
    }
    if t.log_config.max_file_size_mb < 1 {
        errs.push(format!("minimum file size is 1MB; got {}", t.log_config.max_file_size_mb));
    }
    let log_usage = i128::from(t.log_config.max_files) * i128::from(t.log_config.max_file_size_mb);
    if i128::from(g.ephemeral_disk.size_mb) <= log_usage {
        errs.push(format!("log storage ({log_usage} MB) must be less than requested disk capacity ({} MB)", g.ephemeral_disk.size_mb));
    }
    if let Some(l) = &t.lifecycle
        && ![lifecycle_hook::PRESTART, lifecycle_hook::POSTSTART, lifecycle_hook::POSTSTOP].contains(&l.hook.as_str())
    {
        errs.push(format!("Lifecycle validation failed: invalid hook: {}", shown(&l.hook)));
    }
    for (i, c) in t.constraints.iter().enumerate() {
        for e in validate_constraint(c) {
            errs.push(format!("Constraint {} validation failed: {e}", i + 1));
        }
        if c.operand == "distinct_hosts" || c.operand == "distinct_property" {
            errs.push(format!("Constraint {} has disallowed Operand at task level: {}", i + 1, c.operand));
        }
    }
    if job.job_type == JobType::System && !t.affinities.is_empty() {
        errs.push("System jobs may not have an affinity block".to_string());
    } else {
        for (i, a) in t.affinities.iter().enumerate() {
            for e in validate_affinity(a) {
                errs.push(format!("Affinity {} validation failed: {e}", i + 1));
            }
        }
    }
    for (i, a) in t.artifacts.iter().enumerate() {
        let mut fail = |e: String| errs.push(format!("Artifact {} validation failed: {e}", i + 1));
        if a.getter_source.is_empty() {
            fail("source must be specified".to_string());
        }
        if !["", "any", "file", "dir"].contains(&a.getter_mode.as_str()) {
            fail(format!("invalid artifact mode {:?}; must be one of: any, file, dir", &a.getter_mode));
        }
        if path_escapes_alloc(&["task"], &a.relative_dest) {
            fail("destination escapes allocation directory".to_string());
        }
        if let Some(check) = a.getter_options.get("checksum")
            && let Err(e) = validate_artifact_checksum(check)
        {
            fail(e);
        }
    }
    let mut destinations: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, tmpl) in t.templates.iter().enumerate() {
        let mut fail = |e: String| errs.push(format!("Template {} validation failed: {e}", i + 1));
        if tmpl.source_path.is_empty() && tmpl.embedded_tmpl.is_empty() {
            fail("Must specify a source path or have an embedded template".to_string());
        }
        if tmpl.dest_path.is_empty() {
            fail("Must specify a destination for the template".to_string());
        } else if path_escapes_alloc(&["task"], &tmpl.dest_path) {
            fail("destination escapes allocation directory".to_string());
        }
        match tmpl.change_mode.as_str() {
            "" | "noop" | "restart" => {}
            "script" => match &tmpl.change_script {
                None => fail("must specify change script configuration value when change mode is script".to_string()),
                Some(c) if c.command.is_empty() => fail("must specify script path value when change mode is script".to_string()),
                Some(c) if c.timeout < 0 => fail("change script timeout must be positive".to_string()),
                Some(_) => {}
            },
            "signal" => {
                if tmpl.change_signal.is_empty() {
                    fail("Must specify signal value when change mode is signal".to_string());
                }
                if tmpl.envvars {
                    fail("cannot use signals with env var templates".to_string());
                }
            }
            _ => fail("change_mode must be one of [noop, restart, signal, script]".to_string()),
        }
        if tmpl.splay < 0 {
            fail("Must specify positive splay value".to_string());
        }
        if !tmpl.perms.is_empty() && u16::from_str_radix(&tmpl.perms, 8).map_or(true, |p| p > 0o7777) {
            fail(format!("Failed to parse {:?} as octal", &tmpl.perms));
        }
        if let Some(w) = &tmpl.wait {
            if w.min.is_some_and(|m| m < 0) || w.max.is_some_and(|m| m < 0) {
                fail("wait min and max must be positive".to_string());
            }
            if let (Some(min), Some(max)) = (w.min, w.max)
                && min > max
            {
                fail(format!("wait min {} is greater than max {}", go_duration(min), go_duration(max)));
            }
        }
        if let Some(other) = destinations.insert(tmpl.dest_path.as_str(), i + 1) {
            errs.push(format!("Template {} has same destination as {other}", i + 1));
        }
    }
    if let Some(file) = t.dispatch_payload.as_ref().and_then(|d| d.get("File").or_else(|| d.get("file"))).and_then(|f| f.as_str())
        && path_escapes_alloc(&["task", "local"], file)
    {
        errs.push("Dispatch Payload validation failed: destination escapes allocation directory".to_string());
    }
    for (i, m) in t.volume_mounts.iter().enumerate() {
        if !["", "private", "host-to-task", "bidirectional"].contains(&m.propagation_mode.as_str()) {
            errs.push(format!("Volume Mount ({i}) has an invalid propagation mode: {:?}", &m.propagation_mode));
        }
        if m.volume.is_empty() {
            errs.push(format!("Volume Mount ({i}) references an empty volume"));
        } else if !g.volumes.contains_key(&m.volume) {
            errs.push(format!("Volume Mount ({i}) references undefined volume {}", shown(&m.volume)));
        }
        if m.destination.is_empty() {
            errs.push(format!("Volume Mount ({i}) has an empty destination"));
        }
    }
    for s in &t.services {
        for e in validate_service(s, g, Some(t)) {
            errs.push(format!("Service {} is invalid: {e}", shown(&s.name)));
        }
    }
    errs
}

/// Nomad's minimums (`MinResources`, `Resources.Validate`) and our ceiling
/// ([`MAX_RESOURCE_VALUE`]), so every sum the servers form over asks stays inside an `i64`.
fn validate_resources(t: &Task, errs: &mut Vec<String>) {
    let r = &t.resources;
    if r.cores > 0 && r.cpu > 0 {
        errs.push("Task can only ask for 'cpu' or 'cores' resource, not both.".to_string());
    }
    if r.cores == 0 && r.cpu < MIN_CPU_MHZ {
        errs.push(format!("minimum CPU value is {MIN_CPU_MHZ}; got {}", r.cpu));
    }
    if r.cpu > MAX_RESOURCE_VALUE {
        errs.push(format!("maximum CPU value is {MAX_RESOURCE_VALUE}; got {}", r.cpu));
    }
    if r.cores < 0 {
        errs.push(format!("cores can't be negative; got {}", r.cores));
    } else if r.cores > i64::from(u16::MAX) {
        errs.push(format!("maximum cores value is {}; got {}", u16::MAX, r.cores));
    }
    if r.memory_mb < MIN_MEMORY_MB {
        errs.push(format!("minimum MemoryMB value is {MIN_MEMORY_MB}; got {}", r.memory_mb));
    }
    if r.memory_mb > MAX_RESOURCE_VALUE {
        errs.push(format!("maximum MemoryMB value is {MAX_RESOURCE_VALUE}; got {}", r.memory_mb));
    }
    if r.memory_max_mb != 0 && r.memory_max_mb < r.memory_mb {
        errs.push(format!("MemoryMaxMB value ({}) should be larger than MemoryMB value ({})", r.memory_max_mb, r.memory_mb));
    }
    if r.memory_max_mb > MAX_RESOURCE_VALUE {
        errs.push(format!("maximum MemoryMaxMB value is {MAX_RESOURCE_VALUE}; got {}", r.memory_max_mb));
    }
    if r.disk_mb > 0 {
        errs.push("Task can't ask for disk resources, they have to be specified at the task group level.".to_string());
    }
    for n in &r.networks {
        if n.mbits < 0 || n.mbits > MAX_RESOURCE_VALUE {
            errs.push(format!("network MBits must be between 0 and {MAX_RESOURCE_VALUE}; got {}", n.mbits));
        }
    }
    for (i, d) in r.devices.iter().enumerate() {
        if d.name.is_empty() {
            errs.push(format!(
                "device {} failed validation: device name must be given as one of the following: type, vendor/type, or vendor/type/name",
                i + 1
            ));
        }
        if d.count > u64::from(u16::MAX) {
            errs.push(format!("device {} failed validation: maximum count is {}; got {}", i + 1, u16::MAX, d.count));
        }
    }
}

/// Whether `path`, taken relative to `base` (directories under the alloc dir), leaves the
/// alloc dir once cleaned. Nomad's `escapingfs.PathEscapesAllocViaRelative`: absolute paths
/// count as relative, and a path may climb from the task dir into the alloc dir, not above.
/// Whether `s` holds a `${name}` reference Nomad's client would interpolate (its
/// `args.ContainsEnv`: letters, digits, `_`, `-` and `.` between the braces).
pub fn contains_env_reference(s: &str) -> bool {
    s.match_indices("${").any(|(i, _)| {
        let rest = &s[i + 2..];
        let name_len = rest.bytes().take_while(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.')).count();
        name_len > 0 && rest.as_bytes().get(name_len) == Some(&b'}')
    })
}

/// The digest length in bytes of an artifact checksum type.
pub fn checksum_len(kind: &str) -> Option<usize> {
    match kind {
        "md5" => Some(16),
        "sha1" => Some(20),
        "sha256" => Some(32),
        "sha512" => Some(64),
        _ => None,
    }
}

/// Go's `hex.DecodeString`, with its error texts.
pub fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    fn nibble(b: u8) -> Option<u8> {
        (b as char).to_digit(16).map(|d| d as u8)
    }
    let invalid = |b: u8| {
        let c = char::from(b);
        if c.is_control() {
            format!("encoding/hex: invalid byte: U+{:04X}", b)
        } else {
            format!("encoding/hex: invalid byte: U+{:04X} {c:?}", b)
        }
    };
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len() / 2);
    for pair in bytes.chunks(2) {
        let hi = nibble(pair[0]).ok_or_else(|| invalid(pair[0]))?;
        let Some(&lo) = pair.get(1) else {
            return Err("encoding/hex: odd length hex string".to_string());
        };
        out.push(hi << 4 | nibble(lo).ok_or_else(|| invalid(lo))?);
    }
    Ok(out)
}

/// Nomad's `TaskArtifact.validateChecksum`: `md5|sha1|sha256|sha512:<hex>` of the right length,
/// unless the value is interpolated at run time.
fn validate_artifact_checksum(check: &str) -> Result<(), String> {
    if contains_env_reference(check) {
        return Ok(());
    }
    let check = check.trim();
    if check.is_empty() {
        return Err("checksum value cannot be empty".to_string());
    }
    let parts: Vec<&str> = check.split(':').collect();
    let [kind, value] = parts[..] else {
        return Err(format!("checksum must be given as \"type:value\"; got {check:?}"));
    };
    let bytes = decode_hex(value).map_err(|e| format!("invalid checksum: {e}"))?;
    let want = checksum_len(kind).ok_or_else(|| format!("unsupported checksum type: {kind}"))?;
    if bytes.len() != want {
        return Err(format!("invalid {kind} checksum: {value}"));
    }
    Ok(())
}

fn path_escapes_alloc(base: &[&str], path: &str) -> bool {
    // The components below the alloc dir. Nomad cleans the path under a placeholder alloc
    // dir, so one that climbs out and back in by the placeholder's name passes there; here
    // any climb above the alloc dir escapes.
    let mut below: Vec<&str> = base.to_vec();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if below.pop().is_none() {
                    return true;
                }
            }
            p => below.push(p),
        }
    }
    below.first().is_some_and(|first| first.starts_with(".."))
}

fn validate_service(s: &Service, g: &TaskGroup, task: Option<&Task>) -> Vec<String> {
    let mut errs = Vec::new();
    if s.provider != SERVICE_PROVIDER_CONSUL && s.provider != SERVICE_PROVIDER_NOMAD {
        errs.push(format!("Service provider must be one of \"consul\" or \"nomad\"; got {:?}", &s.provider));
    }
    if !s.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '$' || c == '{' || c == '}' || c == '.' || c == '_') {
        errs.push(format!("Service name must be valid per RFC 1123 and can contain only alphanumeric characters or dashes: {:?}", &s.name));
    }
    if !s.port_label.is_empty() && s.port_label.parse::<u16>().is_err() {
        let in_group =
            g.networks.iter().flat_map(|n| n.reserved_ports.iter().chain(n.dynamic_ports.iter())).any(|p| p.label == s.port_label);
        let in_task = task.is_some_and(|t| {
            t.resources.networks.iter().flat_map(|n| n.reserved_ports.iter().chain(n.dynamic_ports.iter())).any(|p| p.label == s.port_label)
        });
        let is_connect = s.connect.is_some();
        if !in_group && !in_task && !is_connect {
            errs.push(format!("port label {:?} referenced by services {} does not exist", &s.port_label, shown(&s.name)));
        }
    }
    if s.provider == SERVICE_PROVIDER_NOMAD && s.connect.is_some() {
        errs.push("Service with provider nomad cannot include Connect blocks".to_string());
    }
    if s.provider == SERVICE_PROVIDER_CONSUL {
        errs.extend(crate::connect::validate_service_connect(s));
    }
    validate_meta("Service", &s.meta, &mut errs);
    let on_update_ok = |v: &str| matches!(v, "" | "require_healthy" | "ignore_warnings" | "ignore");
    if !on_update_ok(&s.on_update) {
        errs.push(format!(
            "Service on_update must be \"require_healthy\", \"ignore_warnings\", or \"ignore\"; not {:?}",
            shown(&s.on_update).as_ref()
        ));
    }
    if s.provider == SERVICE_PROVIDER_NOMAD {
        // Nomad's `validateNomadService`: the port, then the first problem of each check.
        for c in &s.checks {
            if s.port_label.is_empty() && c.port_label.is_empty() && ["http", "tcp", "grpc"].contains(&c.check_type.as_str()) {
                errs.push(format!(
                    "Check {} invalid: check requires a port but neither check nor service {:?} have a port",
                    shown(&c.name),
                    shown(&s.name).as_ref()
                ));
            } else if let Some(e) = validate_nomad_check(c) {
                errs.push(e);
            }
        }
        return errs;
    }
    for c in &s.checks {
        // Nomad's ServiceCheck.validateCommon: on_update, and how it goes with check_restart.
        if !on_update_ok(&c.on_update) {
            errs.push(format!(
                "Check {} invalid: on_update must be \"require_healthy\", \"ignore_warnings\", or \"ignore\"; got {:?}",
                shown(&c.name),
                shown(&c.on_update).as_ref()
            ));
        } else if let Some(r) = &c.check_restart {
            if c.on_update == "ignore" {
                errs.push(format!("Check {} invalid: on_update value \"ignore\" is not compatible with check_restart", shown(&c.name)));
            } else if c.on_update == "ignore_warnings" && !r.ignore_warnings {
                errs.push(format!(
                    "Check {} invalid: on_update value \"ignore_warnings\" not supported with check_restart ignore_warnings value \"false\"",
                    shown(&c.name)
                ));
            }
        }
        if s.port_label.is_empty() && c.port_label.is_empty() && ["http", "tcp", "grpc"].contains(&c.check_type.as_str()) {
            errs.push(format!(
                "Check {} invalid: check requires a port but neither check nor service {:?} have a port",
                shown(&c.name),
                shown(&s.name).as_ref()
            ));
        }
        if !["", "http", "tcp", "script", "grpc"].contains(&c.check_type.as_str()) {
            errs.push(format!("check {:?} has an unsupported type {:?}", &c.name, &c.check_type));
        }
        if c.check_type != "script" && c.interval <= 0 && !c.check_type.is_empty() {
            errs.push(format!("check {:?} needs an interval", &c.name));
        }
        if c.check_type == "script" {
            // Nomad's validateCommon, for the checks the client runs itself.
            const MIN: i64 = 1_000_000_000;
            let name = shown(&c.name);
            if c.command.is_empty() {
                errs.push(format!("Check {name} invalid: script type must have a valid script path"));
            }
            if c.interval == 0 {
                errs.push(format!("Check {name} invalid: missing required value interval. Interval cannot be less than 1s"));
            } else if c.interval < MIN {
                errs.push(format!("Check {name} invalid: interval ({}) cannot be lower than 1s", go_duration(c.interval)));
            }
            if c.timeout == 0 {
                errs.push(format!("Check {name} invalid: missing required value timeout. Timeout cannot be less than 1s"));
            } else if c.timeout < MIN {
                errs.push(format!("Check {name} invalid: timeout ({}) is lower than required minimum timeout 1s", go_duration(c.timeout)));
            }
            if task.is_none() && s.task_name.is_empty() && c.task_name.is_empty() {
                errs.push(format!("Service [{}]->{} or Check {name} must specify task parameter", shown(&g.name), shown(&s.name)));
            }
        }
    }
    errs
}

/// Nomad's `ServiceCheck.validateNomad` (with `validateCommon` for `tcp` and `http`): the first
/// problem of a check the client runs itself, in Nomad's words.
fn validate_nomad_check(c: &ServiceCheck) -> Option<String> {
    const MIN: i64 = 1_000_000_000;
    let check_type = c.check_type.to_ascii_lowercase();
    if !["tcp", "http"].contains(&check_type.as_str()) {
        return Some(format!("invalid check type ({:?}), must be one of tcp, http", shown(&check_type).as_ref()));
    }
    if check_type == "http" {
        if c.path.is_empty() {
            return Some("http type must have http path".into());
        }
        match url_path_kind(&c.path) {
            PathKind::Invalid => return Some("http type must have valid http path".into()),
            PathKind::Absolute => return Some("http type must have relative http path".into()),
            PathKind::Relative => {}
        }
    }
    if c.interval == 0 {
        return Some("missing required value interval. Interval cannot be less than 1s".into());
    } else if c.interval < MIN {
        return Some(format!("interval ({}) cannot be lower than 1s", go_duration(c.interval)));
    }
    if c.timeout == 0 {
        return Some("missing required value timeout. Timeout cannot be less than 1s".into());
    } else if c.timeout < MIN {
        return Some(format!("timeout ({}) is lower than required minimum timeout 1s", go_duration(c.timeout)));
    }
    if !["", "passing", "warning", "critical"].contains(&c.initial_status.as_str()) {
        return Some(format!(
            "invalid initial check state ({}), must be one of \"passing\", \"warning\", \"critical\" or empty",
            shown(&c.initial_status)
        ));
    }
    match c.address_mode.as_str() {
        "" | "host" | "driver" | "alloc" => {}
        "auto" => return Some("invalid address_mode \"auto\" - auto only valid for services".into()),
        other => return Some(format!("invalid address_mode {:?}", shown(other).as_ref())),
    }
    if !["", "ignore", "require_healthy", "ignore_warnings"].contains(&c.on_update.as_str()) {
        return Some(format!(
            "on_update must be \"require_healthy\", \"ignore_warnings\", or \"ignore\"; got {:?}",
            shown(&c.on_update).as_ref()
        ));
    }
    if let Some(r) = &c.check_restart {
        if c.on_update == "ignore" {
            return Some("on_update value \"ignore\" is not compatible with check_restart".into());
        }
        if !r.ignore_warnings && c.on_update == "ignore_warnings" {
            return Some("on_update value \"ignore_warnings\" not supported with check_restart ignore_warnings value \"false\"".into());
        }
        if r.limit < 0 {
            return Some(format!("limit must be greater than or equal to 0 but found {}", r.limit));
        }
        if r.grace < 0 {
            return Some(format!("grace period must be greater than or equal to 0 but found {}", go_duration(r.grace)));
        }
    }
    if c.expose {
        return Some("expose may only be set for Consul service checks".into());
    }
    if c.on_update == "ignore_warnings" {
        return Some("on_update may only be set to ignore_warnings for Consul service checks".into());
    }
    if c.check_restart.as_ref().is_some_and(|r| r.ignore_warnings) {
        return Some("ignore_warnings on check_restart only supported for Consul service checks".into());
    }
    if c.address_mode == "driver" {
        return Some("address_mode = driver may only be set for Consul service checks".into());
    }
    if c.check_type == "http"
        && !c.method.is_empty()
        && !["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE"]
            .contains(&c.method.to_ascii_uppercase().as_str())
    {
        return Some(format!("method type {:?} not supported in Nomad http check", shown(&c.method).as_ref()));
    }
    if c.success_before_passing != 0 {
        return Some("success_before_passing may only be set for Consul service checks".into());
    }
    if c.failures_before_critical != 0 {
        return Some("failures_before_critical may only be set for Consul service checks".into());
    }
    if !c.tls_server_name.is_empty() {
        return Some("tls_server_name may only be set for Consul service checks".into());
    }
    None
}

/// What Go's `url.Parse` makes of a check path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PathKind {
    /// A parse error (control characters, a bad `%` escape, a colon in a first segment).
    Invalid,
    /// It has a scheme (`http://...`).
    Absolute,
    /// A path (and query) to resolve against the check's address.
    Relative,
}

fn url_path_kind(path: &str) -> PathKind {
    if path.chars().any(|c| c.is_ascii_control()) {
        return PathKind::Invalid;
    }
    let b = path.as_bytes();
    let hex = |c: u8| c.is_ascii_hexdigit();
    // Go checks the escapes of the path (the query is kept raw).
    let bq = path.split('?').next().unwrap_or_default().as_bytes();
    let bad_escape = bq.iter().enumerate().any(|(i, c)| *c == b'%' && !(i + 2 < bq.len() && hex(bq[i + 1]) && hex(bq[i + 2])));
    if bad_escape {
        return PathKind::Invalid;
    }
    // Go's getScheme: letters first, then letters, digits, `+`, `-`, `.` up to a `:`.
    if let Some(colon) = path.find(':') {
        let scheme = &b[..colon];
        let before_slash = path.find('/').is_none_or(|slash| colon < slash);
        if colon == 0 {
            return PathKind::Invalid;
        }
        if scheme[0].is_ascii_alphabetic() && scheme.iter().all(|c| c.is_ascii_alphanumeric() || b"+-.".contains(c)) {
            return PathKind::Absolute;
        }
        // "first path segment in URL cannot contain colon".
        if before_slash {
            return PathKind::Invalid;
        }
    }
    PathKind::Relative
}

/// Checks one constraint with Nomad's rules (`Constraint.Validate`); every problem is returned.
pub fn validate_constraint(c: &crate::Constraint) -> Vec<String> {
    let mut errs = Vec::new();
    if c.operand.is_empty() {
        errs.push("Missing constraint operand".to_string());
    }
    let mut needs_l_target = true;
    match c.operand.as_str() {
        "distinct_hosts" => needs_l_target = false,
        "set_contains" | "set_contains_all" | "set_contains_any" => {
            if c.r_target.is_empty() {
                errs.push("Set contains constraint requires an RTarget".to_string());
            }
        }
        "regexp" => {
            if let Err(e) = compile_regexp(&c.r_target) {
                errs.push(format!("Regular expression failed to compile: {e}"));
            }
        }
        "version" => {
            if let Err(e) = crate::version::validate_version_constraint(&c.r_target, false) {
                errs.push(format!("Version constraint is invalid: {}", shown(&e)));
            }
        }
        "semver" => {
            if let Err(e) = crate::version::validate_version_constraint(&c.r_target, true) {
                errs.push(format!("Semver constraint is invalid: {}", shown(&e)));
            }
        }
        "distinct_property" => {
            if !c.r_target.is_empty() {
                match c.r_target.parse::<u64>() {
                    Err(e) => errs.push(format!("Failed to convert RTarget {:?} to uint64: {e}", &c.r_target)),
                    Ok(0) => errs.push("Distinct Property must have an allowed count of 1 or greater: 0 < 1".to_string()),
                    Ok(_) => {}
                }
            }
        }
        "is_set" | "is_not_set" => {
            if !c.r_target.is_empty() {
                errs.push(format!("Operator {:?} does not support an RTarget", c.operand));
            }
        }
        "=" | "==" | "is" | "!=" | "not" | "<" | "<=" | ">" | ">=" => {
            if c.r_target.is_empty() {
                errs.push(format!("Operator {:?} requires an RTarget", c.operand));
            }
        }
        "" => {}
        other => errs.push(format!("Unknown constraint type {:?}", other)),
    }
    if needs_l_target && c.l_target.is_empty() {
        errs.push("No LTarget provided but is required by constraint".to_string());
    }
    errs
}

/// Compiles a constraint's pattern as the scheduler will, with a bound on its compiled size.
fn compile_regexp(pattern: &str) -> Result<(), String> {
    regex::RegexBuilder::new(pattern).size_limit(1 << 20).build().map(|_| ()).map_err(|e| {
        // The regex crate's messages span lines (the pattern, a caret, the error); keep the error.
        let text = e.to_string();
        let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim();
        let what = last.strip_prefix("error: ").unwrap_or(last);
        format!("error parsing regexp: {}: `{}`", what, shown(pattern))
    })
}

fn validate_affinity(a: &crate::Affinity) -> Vec<String> {
    let mut errs = Vec::new();
    if a.operand.is_empty() {
        errs.push("Missing affinity operand".to_string());
    }
    match a.operand.as_str() {
        "set_contains" | "set_contains_all" | "set_contains_any" => {
            if a.r_target.is_empty() {
                errs.push("Set contains operators require an RTarget".to_string());
            }
        }
        "regexp" => {
            if let Err(e) = compile_regexp(&a.r_target) {
                errs.push(format!("Regular expression failed to compile: {e}"));
            }
        }
        "version" => {
            if let Err(e) = crate::version::validate_version_constraint(&a.r_target, false) {
                errs.push(format!("Version affinity is invalid: {}", shown(&e)));
            }
        }
        "semver" => {
            if let Err(e) = crate::version::validate_version_constraint(&a.r_target, true) {
                errs.push(format!("Semver affinity is invalid: {}", shown(&e)));
            }
        }
        "=" | "==" | "is" | "!=" | "not" | "<" | "<=" | ">" | ">=" => {
            if a.r_target.is_empty() {
                errs.push(format!("Operator {:?} requires an RTarget", a.operand));
            }
        }
        "" => {}
        other => errs.push(format!("Unknown affinity operator {:?}", other)),
    }
    if a.l_target.is_empty() {
        errs.push("No LTarget provided but is required".to_string());
    }
    if a.weight == 0 {
        errs.push("Affinity weight cannot be zero".to_string());
    }
    if !(-100..=100).contains(&a.weight) {
        errs.push("Affinity weight must be within the range [-100,100]".to_string());
    }
    errs
}

fn validate_spread(s: &Spread) -> Vec<String> {
    let mut errs = Vec::new();
    if s.attribute.is_empty() {
        errs.push("Missing spread attribute".to_string());
    }
    if s.weight <= 0 || s.weight > 100 {
        errs.push("Spread block must have a positive weight from 0 to 100".to_string());
    }
    let mut seen = BTreeSet::new();
    let mut sum: i128 = 0;
    for t in &s.spread_target {
        if !seen.insert(t.value.as_str()) {
            errs.push(format!("Spread target value {:?} already defined", &t.value));
        }
        if !(0..=100).contains(&t.percent) {
            errs.push(format!("Spread target percentage for value {:?} must be between 0 and 100", &t.value));
        }
        sum += i128::from(t.percent);
    }
    if sum > 100 {
        errs.push(format!("Sum of spread target percentages must not be greater than 100%; got {sum}%"));
    }
    errs
}

/// A duration in nanoseconds as Go prints a `time.Duration` (`1h0m0s`, `1.5s`, `300ms`, `0s`).
pub(crate) fn go_duration(ns: impl Into<i128>) -> String {
    let ns: i128 = ns.into();
    if ns == 0 {
        return "0s".to_string();
    }
    let sign = if ns < 0 { "-" } else { "" };
    let n = ns.unsigned_abs();
    let frac = |v: u128, unit: u128| -> String {
        let (whole, rest) = (v / unit, v % unit);
        if rest == 0 {
            return whole.to_string();
        }
        let digits = unit.ilog10() as usize;
        format!("{whole}.{}", format!("{rest:0digits$}").trim_end_matches('0'))
    };
    let body = if n < 1_000 {
        format!("{n}ns")
    } else if n < 1_000_000 {
        format!("{}µs", frac(n, 1_000))
    } else if n < 1_000_000_000 {
        format!("{}ms", frac(n, 1_000_000))
    } else {
        let secs = n / 1_000_000_000;
        let (h, m) = (secs / 3600, (secs % 3600) / 60);
        let s = frac(n % 60_000_000_000, 1_000_000_000);
        if h > 0 {
            format!("{h}h{m}m{s}s")
        } else if m > 0 {
            format!("{m}m{s}s")
        } else {
            format!("{s}s")
        }
    };
    format!("{sign}{body}")
}

impl Node {
    /// Checks what a registering node says about itself, with Nomad's messages where Nomad
    /// checks (`Node.Register`) and ours for the fields that reach paths, URLs and logs.
    /// The first problem is returned.
    pub fn validate_registration(&self) -> Result<(), String> {
        let text = |what: &str, v: &str, max: usize| -> Result<(), String> {
            if has_unsafe(v) {
                Err(format!("node {what} {:?} contains a control character", v))
            } else if v.len() > max {
                Err(format!("node {what} is longer than {max} bytes"))
            } else {
                Ok(())
            }
        };
        // The ID names the node in URLs (`/v1/node/<id>`) and on every line that mentions it.
        text("ID", &self.id, MAX_NODE_ID_BYTES)?;
        if self.id.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(format!("node ID {:?} cannot contain spaces or slashes", &self.id));
        }
        if has_unsafe(&self.secret_id) || self.secret_id.len() > MAX_NODE_ID_BYTES {
            // Never echo a secret.
            return Err(format!("node secret ID must be at most {MAX_NODE_ID_BYTES} bytes without control characters"));
        }
        text("name", &self.name, MAX_NAME_BYTES)?;
        text("datacenter", &self.datacenter, MAX_NAME_BYTES)?;
        text("class", &self.node_class, MAX_NAME_BYTES)?;
        text("HTTP address", &self.http_addr, MAX_NAME_BYTES)?;
        if !self.node_pool.is_empty() {
            validate_node_pool_name(&self.node_pool).map_err(|e| format!("invalid node pool: {e}"))?;
        }
        let map = |what: &str, m: &BTreeMap<String, String>| -> Result<(), String> {
            for (k, v) in m {
                if k.is_empty() || has_unsafe(k) {
                    return Err(format!("node {what} key {:?} must be non-empty without control characters", k));
                }
                if v.contains('\0') {
                    return Err(format!("node {what} value of {:?} contains a null character", k));
                }
            }
            Ok(())
        };
        map("attribute", &self.attributes)?;
        map("meta", &self.meta)?;
        map("link", &self.links)?;
        for (name, d) in &self.drivers {
            text("driver name", name, MAX_NAME_BYTES)?;
            map("driver attribute", &d.attributes)?;
        }
        for (name, v) in &self.host_volumes {
            text("host volume name", name, MAX_NAME_BYTES)?;
            if has_unsafe(&v.path) {
                return Err(format!("node host volume {:?} path contains a control character", name));
            }
        }
        let bounded = |what: &str, v: i64| -> Result<(), String> {
            if (0..=MAX_RESOURCE_VALUE).contains(&v) {
                Ok(())
            } else {
                Err(format!("node {what} must be between 0 and {MAX_RESOURCE_VALUE}; got {v}"))
            }
        };
        // A core ID is a u16: a longer list can only repeat IDs, and the scheduler copies it.
        let cores = |what: &str, list: &[u16]| -> Result<(), String> {
            if list.len() > MAX_NODE_CORE_IDS {
                Err(format!("node {what} lists {} cores, more than {MAX_NODE_CORE_IDS}", list.len()))
            } else {
                Ok(())
            }
        };
        if let Some(r) = &self.node_resources {
            bounded("CPU (MHz)", r.cpu.cpu_shares)?;
            cores("reservable CPU cores", &r.cpu.reservable_cpu_cores)?;
            bounded("memory (MB)", r.memory.memory_mb)?;
            bounded("disk (MB)", r.disk.disk_mb)?;
            for n in &r.networks {
                bounded("network MBits", n.mbits)?;
            }
            for n in &r.node_networks {
                bounded("network interface speed", n.speed)?;
            }
            for (what, p) in [("min_dynamic_port", r.min_dynamic_port), ("max_dynamic_port", r.max_dynamic_port)] {
                if !(0..=65535).contains(&p) {
                    return Err(format!("node {what} must be between 0 and 65535; got {p}"));
                }
            }
            if r.min_dynamic_port > 0 && r.max_dynamic_port > 0 && r.min_dynamic_port > r.max_dynamic_port {
                return Err(format!("node dynamic port range {}-{} is empty", r.min_dynamic_port, r.max_dynamic_port));
            }
        }
        if let Some(r) = &self.reserved_resources {
            bounded("reserved CPU (MHz)", r.cpu.cpu_shares)?;
            cores("reserved CPU cores", &r.cpu.reserved_cpu_cores)?;
            bounded("reserved memory (MB)", r.memory.memory_mb)?;
            bounded("reserved disk (MB)", r.disk.disk_mb)?;
            validate_port_list(&r.networks.reserved_host_ports).map_err(|e| format!("node reserved host ports: {e}"))?;
        }
        Ok(())
    }
}

/// Most core IDs a node may list as reservable or reserved: every `u16` once.
pub const MAX_NODE_CORE_IDS: usize = 1 << 16;

/// Longest namespace description, bytes (Nomad's `maxNamespaceDescriptionLength`).
pub const MAX_NAMESPACE_DESCRIPTION_BYTES: usize = 256;

impl crate::Namespace {
    /// Nomad's `Namespace.Validate`: the name is 1-128 letters, digits and dashes (no
    /// underscores, unlike node pools), the description at most 256 bytes; meta as a job's.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errs = Vec::new();
        if !(1..=128).contains(&self.name.len()) || !self.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            errs.push(format!("invalid name {:?}. Must match regex ^[a-zA-Z0-9-]{{1,128}}$", self.name));
        }
        if self.description.len() > MAX_NAMESPACE_DESCRIPTION_BYTES {
            errs.push(format!("description longer than {MAX_NAMESPACE_DESCRIPTION_BYTES}"));
        }
        validate_meta("Namespace", &self.meta, &mut errs);
        if errs.is_empty() { Ok(()) } else { Err(ValidationErrors(errs)) }
    }
}

/// A port list such as `22,80,8000-8100`: each port 0-65535, each range in order.
fn validate_port_list(list: &str) -> Result<(), String> {
    if list.len() > MAX_RESERVED_PORTS_BYTES {
        return Err(format!("longer than {MAX_RESERVED_PORTS_BYTES} bytes"));
    }
    let port = |s: &str| -> Result<u32, String> {
        s.trim().parse::<u32>().ok().filter(|p| *p <= 65535).ok_or_else(|| format!("{:?} is not a port (0-65535)", s.trim()))
    };
    for part in list.split(',').filter(|p| !p.trim().is_empty()) {
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (port(lo)?, port(hi)?);
                if lo > hi {
                    return Err(format!("range {lo}-{hi} ends before it starts"));
                }
            }
            None => {
                port(part)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
