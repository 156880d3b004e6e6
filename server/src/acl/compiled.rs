//! A token's policies compiled into one [`Acl`] answering capability questions.
//!
//! Per label, capabilities are unioned across the policies; `deny` clears the label and blocks
//! later additions. Coarse blocks take the maximum (deny > write > read > list). A request for
//! namespace `X` uses the exact (glob-free) label if one exists, even over a glob deny; else the
//! matching glob with the smallest `len(X) - len(glob) + count('*')` (the one whose literal part
//! covers most of `X`). Host volumes, node pools and variable paths match the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::policy::{Level, Policy, labelled_rule_capabilities, namespace_rule_capabilities, path_rule_capabilities};

/// The capabilities of one label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Caps {
    deny: bool,
    set: BTreeSet<String>,
}

impl Caps {
    fn add(&mut self, cap: &str) {
        if self.deny {
            return;
        }
        if cap == "deny" {
            self.deny = true;
            self.set.clear();
        } else {
            self.set.insert(cap.to_string());
        }
    }

    fn has(&self, cap: &str) -> bool {
        !self.deny && self.set.contains(cap)
    }

    fn any(&self) -> bool {
        !self.deny && !self.set.is_empty()
    }
}

/// Labels split into exact names and globs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Rules {
    exact: BTreeMap<String, Caps>,
    globs: BTreeMap<String, Caps>,
}

impl Rules {
    fn entry(&mut self, label: &str) -> &mut Caps {
        if label.contains('*') {
            self.globs.entry(label.to_string()).or_default()
        } else {
            self.exact.entry(label.to_string()).or_default()
        }
    }

    /// The rule that governs `name`: the exact one, else the closest glob.
    fn lookup(&self, name: &str) -> Option<&Caps> {
        if let Some(c) = self.exact.get(name) {
            return Some(c);
        }
        closest_glob(self.globs.iter().map(|(g, c)| (g.as_str(), c)), name)
    }

    fn all(&self) -> impl Iterator<Item = &Caps> {
        self.exact.values().chain(self.globs.values())
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters (even none).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p = pattern.as_bytes();
    let t = text.as_bytes();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Among `globs` matching `name`, the one with the smallest `len(name) - len(glob) + stars`;
/// ties go to the first in iteration order.
fn closest_glob<'a, T>(globs: impl Iterator<Item = (&'a str, T)>, name: &str) -> Option<T> {
    let mut best: Option<(i64, T)> = None;
    for (g, v) in globs {
        if !glob_match(g, name) {
            continue;
        }
        let score = name.len() as i64 - g.len() as i64 + g.matches('*').count() as i64;
        if best.as_ref().is_none_or(|(s, _)| score < *s) {
            best = Some((score, v));
        }
    }
    best.map(|(_, v)| v)
}

/// A compiled set of policies (or the management token's allow-all).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acl {
    management: bool,
    namespaces: Rules,
    /// Keyed `namespace NUL path`.
    variables: Rules,
    host_volumes: Rules,
    node_pools: Rules,
    agent: Level,
    node: Level,
    operator: Level,
    quota: Level,
    plugin: Level,
    /// What a workload identity may do without a policy (Nomad's implicit workload access).
    workload: Option<Arc<WorkloadGrant>>,
}

/// The pseudo-capability the service read routes accept beside `read-job`: a workload identity
/// may read the Nomad services of its own namespace (`nomadService` in templates), nothing else
/// of its jobs. No policy can grant it (policy capabilities are checked against Nomad's list).
pub const WORKLOAD_READ_SERVICES: &str = "workload-read-services";

/// A workload's implicit grants: read and list on exactly `nomad/jobs`, `nomad/jobs/<job>`,
/// `nomad/jobs/<job>/<group>` and `nomad/jobs/<job>/<group>/<task>` in its namespace, and service
/// reads there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadGrant {
    /// The workload's namespace.
    pub namespace: String,
    /// The four variable paths.
    pub paths: [String; 4],
}

impl Acl {
    /// The ACL of a workload identity.
    pub fn workload(namespace: &str, job: &str, group: &str, task: &str) -> Acl {
        let paths = nomad_proto::variables::workload_paths(job, group, task);
        Acl { workload: Some(Arc::new(WorkloadGrant { namespace: namespace.into(), paths })), ..Acl::default() }
    }

    /// The management token's ACL: everything allowed.
    pub fn management() -> Acl {
        Acl { management: true, ..Acl::default() }
    }

    /// Compiles `policies` (a token's, in any order: the result does not depend on it).
    pub fn compile<'a>(policies: impl IntoIterator<Item = &'a Policy>) -> Acl {
        let mut acl = Acl::default();
        for p in policies {
            for ns in &p.namespaces {
                let caps = acl.namespaces.entry(&ns.name);
                for c in namespace_rule_capabilities(ns) {
                    caps.add(c);
                }
                for v in &ns.variables {
                    let caps = acl.variables.entry(&format!("{}\0{}", ns.name, v.path));
                    let granted = path_rule_capabilities(v);
                    // deny first: it wins over whatever else the same rule lists.
                    if granted.contains("deny") {
                        caps.add("deny");
                    }
                    for c in granted {
                        caps.add(c);
                    }
                }
            }
            for hv in &p.host_volumes {
                let caps = acl.host_volumes.entry(&hv.name);
                for c in labelled_rule_capabilities("host_volume", hv) {
                    caps.add(c);
                }
            }
            for np in &p.node_pools {
                let caps = acl.node_pools.entry(&np.name);
                for c in labelled_rule_capabilities("node_pool", np) {
                    caps.add(c);
                }
            }
            acl.agent = acl.agent.max(p.agent);
            acl.node = acl.node.max(p.node);
            acl.operator = acl.operator.max(p.operator);
            acl.quota = acl.quota.max(p.quota);
            acl.plugin = acl.plugin.max(p.plugin);
        }
        // Deny anywhere in a namespace rule's own capability list means deny (done by `add`).
        acl
    }

    /// Whether this is the management ACL.
    pub fn is_management(&self) -> bool {
        self.management
    }

    /// Whether `cap` is allowed in namespace `ns`. `*` asks whether any namespace allows it (list
    /// routes then filter per object).
    pub fn allow_namespace_op(&self, ns: &str, cap: &str) -> bool {
        if self.management {
            return true;
        }
        if cap == WORKLOAD_READ_SERVICES {
            return self.workload.as_ref().is_some_and(|w| ns == "*" || ns == w.namespace);
        }
        if ns == "*" {
            return self.namespaces.all().any(|c| c.has(cap));
        }
        self.namespaces.lookup(ns).is_some_and(|c| c.has(cap))
    }

    /// Whether namespace `ns` grants anything at all (namespace reads).
    pub fn allow_namespace(&self, ns: &str) -> bool {
        if self.management {
            return true;
        }
        if ns == "*" {
            return self.namespaces.all().any(Caps::any);
        }
        self.namespaces.lookup(ns).is_some_and(Caps::any)
    }

    /// Whether `op` (list, read, write, destroy) is allowed on variable `path` in `ns`.
    pub fn allow_variable_op(&self, ns: &str, path: &str, op: &str) -> bool {
        if self.management {
            return true;
        }
        if let Some(w) = &self.workload
            && ns == w.namespace
            && matches!(op, "read" | "list")
            && w.paths.iter().any(|p| p == path)
        {
            return true;
        }
        self.variables.lookup(&format!("{ns}\0{path}")).is_some_and(|c| c.has(op))
    }

    /// Whether `cap` (mount-readonly, mount-readwrite) is allowed on host volume `name`.
    pub fn allow_host_volume_op(&self, name: &str, cap: &str) -> bool {
        self.management || self.host_volumes.lookup(name).is_some_and(|c| c.has(cap))
    }

    /// Whether `cap` (read, write, delete) is allowed on node pool `name`.
    pub fn allow_node_pool_op(&self, name: &str, cap: &str) -> bool {
        self.management || self.node_pools.lookup(name).is_some_and(|c| c.has(cap))
    }

    fn coarse(&self, level: Level, write: bool) -> bool {
        self.management || if write { level == Level::Write } else { matches!(level, Level::Read | Level::Write) }
    }

    /// `agent` read (write if `write`).
    pub fn allow_agent(&self, write: bool) -> bool {
        self.coarse(self.agent, write)
    }

    /// `node` read (write if `write`).
    pub fn allow_node(&self, write: bool) -> bool {
        self.coarse(self.node, write)
    }

    /// `operator` read (write if `write`).
    pub fn allow_operator(&self, write: bool) -> bool {
        self.coarse(self.operator, write)
    }

    /// `quota` read (write if `write`).
    pub fn allow_quota(&self, write: bool) -> bool {
        self.coarse(self.quota, write)
    }

    /// `plugin` read.
    pub fn allow_plugin_read(&self) -> bool {
        self.management || matches!(self.plugin, Level::Read)
    }

    /// `plugin` list (read implies it).
    pub fn allow_plugin_list(&self) -> bool {
        self.management || matches!(self.plugin, Level::Read | Level::List)
    }
}
