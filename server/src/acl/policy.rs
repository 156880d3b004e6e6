//! The ACL policy language: HCL or its JSON form, parsed into [`Policy`].
//!
//! ```hcl
//! namespace "default" { policy = "read"  capabilities = ["alloc-exec"]
//!   variables { path "app/*" { capabilities = ["read"] } } }
//! namespace "prod-*" { policy = "deny" }
//! node_pool "gpu" { policy = "read" }
//! host_volume "data" { policy = "write" }
//! agent { policy = "read" }   node { policy = "write" }   operator { policy = "read" }
//! quota { policy = "read" }   plugin { policy = "list" }
//! ```
//!
//! Labelled blocks (`namespace`, `node_pool`, `host_volume`, `path`) must carry their label: an
//! unlabelled one is refused (Nomad once applied it to a namespace named after its first key,
//! CVE-2023-3072). Empty rules are a policy that grants nothing (as Nomad takes them); any other
//! document with none of the blocks is `Invalid policy`; a syntax error is
//! `Failed to parse ACL Policy: ...`.

use std::collections::BTreeSet;

/// Every capability a namespace rule may grant.
pub const NAMESPACE_CAPABILITIES: &[&str] = &[
    "deny",
    "list-jobs",
    "parse-job",
    "read-job",
    "submit-job",
    "dispatch-job",
    "read-logs",
    "read-fs",
    "alloc-exec",
    "alloc-node-exec",
    "alloc-lifecycle",
    "csi-register-plugin",
    "csi-write-volume",
    "csi-read-volume",
    "csi-list-volume",
    "csi-mount-volume",
    "list-scaling-policies",
    "read-scaling-policy",
    "read-job-scaling",
    "scale-job",
    "submit-recommendation",
    "sentinel-override",
];

/// What `policy = "read"` grants in a namespace.
pub const NAMESPACE_READ: &[&str] = &[
    "list-jobs",
    "parse-job",
    "read-job",
    "csi-list-volume",
    "csi-read-volume",
    "read-job-scaling",
    "list-scaling-policies",
    "read-scaling-policy",
];

/// What `policy = "write"` adds to `read`.
pub const NAMESPACE_WRITE_EXTRA: &[&str] = &[
    "scale-job",
    "submit-job",
    "dispatch-job",
    "read-logs",
    "read-fs",
    "alloc-exec",
    "alloc-lifecycle",
    "csi-mount-volume",
    "csi-write-volume",
    "submit-recommendation",
];

/// What `policy = "scale"` grants.
pub const NAMESPACE_SCALE: &[&str] = &["list-scaling-policies", "read-scaling-policy", "read-job-scaling", "scale-job"];

/// Capabilities of a `variables { path "..." {} }` rule.
pub const VARIABLE_CAPABILITIES: &[&str] = &["list", "read", "write", "destroy", "deny"];

/// Capabilities of a `host_volume` rule.
pub const HOST_VOLUME_CAPABILITIES: &[&str] = &["deny", "mount-readonly", "mount-readwrite"];

/// Capabilities of a `node_pool` rule.
pub const NODE_POOL_CAPABILITIES: &[&str] = &["deny", "read", "write", "delete"];

/// A coarse (unlabelled) block's level. Compiling takes the maximum, in declaration order:
/// `Deny` beats everything.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Level {
    /// Nothing said (or `scale` on a block without scaling: grants nothing).
    #[default]
    None,
    /// `list` (plugin only).
    List,
    /// `read`.
    Read,
    /// `write`.
    Write,
    /// `deny`.
    Deny,
}

/// A `namespace "<name>"` rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NamespaceRule {
    /// The label (may hold `*` globs).
    pub name: String,
    /// `policy`, empty if unset.
    pub policy: String,
    /// `capabilities`.
    pub capabilities: Vec<String>,
    /// `variables { path "<glob>" { capabilities } }`.
    pub variables: Vec<PathRule>,
}

/// A `path "<glob>"` rule of a `variables` block.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathRule {
    /// The label (may hold `*` globs).
    pub path: String,
    /// `capabilities`.
    pub capabilities: Vec<String>,
}

/// A labelled rule of another kind (`host_volume`, `node_pool`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelledRule {
    /// The label (may hold `*` globs).
    pub name: String,
    /// `policy`, empty if unset.
    pub policy: String,
    /// `capabilities`.
    pub capabilities: Vec<String>,
}

/// A parsed, validated policy document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Policy {
    /// `namespace` rules, in order.
    pub namespaces: Vec<NamespaceRule>,
    /// `host_volume` rules.
    pub host_volumes: Vec<LabelledRule>,
    /// `node_pool` rules.
    pub node_pools: Vec<LabelledRule>,
    /// `agent { policy }`.
    pub agent: Level,
    /// `node { policy }`.
    pub node: Level,
    /// `operator { policy }`.
    pub operator: Level,
    /// `quota { policy }`.
    pub quota: Level,
    /// `plugin { policy }`.
    pub plugin: Level,
}

/// Why a policy document was refused (the text is Nomad's, shown to the caller in a 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(pub String);

fn parse_err(msg: impl std::fmt::Display) -> PolicyError {
    PolicyError(format!("Failed to parse ACL Policy: {msg}"))
}

/// A scalar or list attribute value.
#[derive(Debug, Clone)]
enum Val {
    Str(String),
    List(Vec<String>),
    Other,
}

/// The document as a tree, whatever its syntax.
#[derive(Debug, Default)]
struct Tree {
    attrs: Vec<(String, Val)>,
    blocks: Vec<(String, Option<String>, Tree)>,
}

/// Block kinds that take one label.
const LABELLED: &[&str] = &["namespace", "host_volume", "node_pool", "path"];

fn tree_from_hcl(body: &hcl::Body) -> Result<Tree, PolicyError> {
    let mut t = Tree::default();
    for s in body.iter() {
        match s {
            hcl::Structure::Attribute(a) => {
                let v = match &a.expr {
                    hcl::Expression::String(s) => Val::Str(s.clone()),
                    hcl::Expression::Array(items) => Val::List(
                        items
                            .iter()
                            .map(|e| match e {
                                hcl::Expression::String(s) => Ok(s.clone()),
                                other => Err(parse_err(format!("{}: expected a string, got {other:?}", a.key.as_str()))),
                            })
                            .collect::<Result<_, _>>()?,
                    ),
                    _ => Val::Other,
                };
                t.attrs.push((a.key.to_string(), v));
            }
            hcl::Structure::Block(b) => {
                let labels: Vec<String> = b.labels.iter().map(|l| l.as_str().to_string()).collect();
                if labels.len() > 1 {
                    return Err(parse_err(format!("block {:?} takes at most one label", b.identifier.as_str())));
                }
                t.blocks.push((b.identifier.to_string(), labels.into_iter().next(), tree_from_hcl(&b.body)?));
            }
        }
    }
    Ok(t)
}

fn tree_from_json(v: &serde_json::Value) -> Result<Tree, PolicyError> {
    let serde_json::Value::Object(map) = v else { return Err(parse_err("expected a JSON object")) };
    let mut t = Tree::default();
    for (k, v) in map {
        match v {
            serde_json::Value::String(s) => t.attrs.push((k.clone(), Val::Str(s.clone()))),
            serde_json::Value::Array(items) if items.iter().all(|i| i.is_string()) => {
                t.attrs.push((k.clone(), Val::List(items.iter().filter_map(|i| i.as_str().map(str::to_string)).collect())))
            }
            serde_json::Value::Array(items) => {
                for i in items {
                    push_json_block(&mut t, k, i)?;
                }
            }
            serde_json::Value::Object(_) => push_json_block(&mut t, k, v)?,
            _ => t.attrs.push((k.clone(), Val::Other)),
        }
    }
    Ok(t)
}

fn push_json_block(t: &mut Tree, kind: &str, v: &serde_json::Value) -> Result<(), PolicyError> {
    let serde_json::Value::Object(map) = v else { return Err(parse_err(format!("{kind}: expected an object"))) };
    if LABELLED.contains(&kind) {
        // `{"namespace": {"<label>": {...}}}`; a body without the label level is unlabelled.
        for (label, body) in map {
            let bodies: Vec<&serde_json::Value> = match body {
                serde_json::Value::Array(items) => items.iter().collect(),
                other => vec![other],
            };
            for b in bodies {
                if !b.is_object() {
                    t.blocks.push((kind.to_string(), None, Tree::default()));
                    continue;
                }
                t.blocks.push((kind.to_string(), Some(label.clone()), tree_from_json(b)?));
            }
        }
        Ok(())
    } else {
        t.blocks.push((kind.to_string(), None, tree_from_json(v)?));
        Ok(())
    }
}

impl Tree {
    fn str_attr(&self, key: &str) -> Result<String, PolicyError> {
        match self.attrs.iter().rev().find(|(k, _)| k == key) {
            None => Ok(String::new()),
            Some((_, Val::Str(s))) => Ok(s.clone()),
            Some(_) => Err(parse_err(format!("{key}: expected a string"))),
        }
    }

    fn list_attr(&self, key: &str) -> Result<Vec<String>, PolicyError> {
        match self.attrs.iter().rev().find(|(k, _)| k == key) {
            None => Ok(Vec::new()),
            Some((_, Val::List(l))) => Ok(l.clone()),
            Some(_) => Err(parse_err(format!("{key}: expected a list of strings"))),
        }
    }
}

fn labelled<'a>(kind: &str, label: &'a Option<String>) -> Result<&'a str, PolicyError> {
    label.as_deref().ok_or_else(|| parse_err(format!("{kind} block requires a label, such as {kind} \"name\" {{ ... }}")))
}

/// Whether `name` is a valid namespace or host volume label (`^[a-zA-Z0-9-*]{1,128}$`).
pub fn valid_namespace_label(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*')
}

/// Whether `name` is a valid node pool label (namespace characters plus `_`).
pub fn valid_node_pool_label(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '*' || c == '_')
}

/// Whether `name` is a valid policy (or role) name (`^[a-zA-Z0-9-]{1,128}$`).
pub fn valid_policy_name(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
}

fn coarse(kind: &str, t: &Tree, allowed: &[(&str, Level)]) -> Result<Level, PolicyError> {
    let p = t.str_attr("policy")?;
    allowed.iter().find(|(n, _)| *n == p).map(|(_, l)| *l).ok_or_else(|| PolicyError(format!("Invalid {kind} policy: {p:?}")))
}

const COARSE_LEVELS: &[(&str, Level)] =
    &[("deny", Level::Deny), ("read", Level::Read), ("write", Level::Write), ("scale", Level::None), ("", Level::None)];
const PLUGIN_LEVELS: &[(&str, Level)] = &[("deny", Level::Deny), ("read", Level::Read), ("list", Level::List), ("", Level::None)];

fn check_caps(kind: &str, caps: &[String], valid: &[&str]) -> Result<(), PolicyError> {
    match caps.iter().find(|c| !valid.contains(&c.as_str())) {
        Some(c) => Err(PolicyError(format!("Invalid {kind} capability '{c}'"))),
        None => Ok(()),
    }
}

impl Policy {
    /// Parses a policy document: HCL, or JSON when it starts with `{`.
    pub fn parse(rules: &str) -> Result<Policy, PolicyError> {
        if rules.is_empty() {
            return Ok(Policy::default());
        }
        let tree = if rules.trim_start().starts_with('{') {
            let v: serde_json::Value = serde_json::from_str(rules).map_err(parse_err)?;
            tree_from_json(&v)?
        } else {
            let body: hcl::Body = hcl::parse(rules).map_err(|e| parse_err(e.to_string().trim_end()))?;
            tree_from_hcl(&body)?
        };
        Policy::from_tree(&tree)
    }

    fn from_tree(t: &Tree) -> Result<Policy, PolicyError> {
        let mut p = Policy::default();
        let mut any = false;
        for (kind, label, body) in &t.blocks {
            match kind.as_str() {
                "namespace" => {
                    let name = labelled(kind, label)?;
                    if !valid_namespace_label(name) {
                        return Err(PolicyError(format!("Invalid namespace name: {name:?}")));
                    }
                    let policy = body.str_attr("policy")?;
                    if !["", "deny", "read", "write", "scale"].contains(&policy.as_str()) {
                        return Err(PolicyError(format!("Invalid namespace policy: {policy:?}")));
                    }
                    let capabilities = body.list_attr("capabilities")?;
                    check_caps("namespace", &capabilities, NAMESPACE_CAPABILITIES)?;
                    let mut variables = Vec::new();
                    for (vk, vl, vb) in &body.blocks {
                        if vk != "variables" {
                            continue;
                        }
                        if vl.is_some() {
                            return Err(parse_err("variables block takes no label"));
                        }
                        let before = variables.len();
                        for (pk, pl, pb) in &vb.blocks {
                            if pk != "path" {
                                continue;
                            }
                            let path = labelled(pk, pl)?;
                            let caps = pb.list_attr("capabilities")?;
                            check_caps("variable", &caps, VARIABLE_CAPABILITIES)?;
                            variables.push(PathRule { path: path.to_string(), capabilities: caps });
                        }
                        if variables.len() == before {
                            return Err(PolicyError("Invalid variable policy: no variable paths in namespace".into()));
                        }
                    }
                    p.namespaces.push(NamespaceRule { name: name.to_string(), policy, capabilities, variables });
                }
                "host_volume" | "node_pool" => {
                    let name = labelled(kind, label)?;
                    let host_volume = kind == "host_volume";
                    let valid_policies: &[&str] = &["", "deny", "read", "write"];
                    let valid_caps = if host_volume { HOST_VOLUME_CAPABILITIES } else { NODE_POOL_CAPABILITIES };
                    let valid_name = if host_volume { valid_namespace_label(name) } else { valid_node_pool_label(name) };
                    if !valid_name {
                        return Err(PolicyError(format!("Invalid {kind} name: {name:?}")));
                    }
                    let policy = body.str_attr("policy")?;
                    if !valid_policies.contains(&policy.as_str()) {
                        return Err(PolicyError(format!("Invalid {kind} policy: {policy:?}")));
                    }
                    let capabilities = body.list_attr("capabilities")?;
                    check_caps(kind, &capabilities, valid_caps)?;
                    let rule = LabelledRule { name: name.to_string(), policy, capabilities };
                    if kind == "host_volume" {
                        p.host_volumes.push(rule);
                    } else {
                        p.node_pools.push(rule);
                    }
                }
                "agent" | "node" | "operator" | "quota" | "plugin" => {
                    if label.is_some() {
                        return Err(parse_err(format!("{kind} block takes no label")));
                    }
                    let levels = if kind == "plugin" { PLUGIN_LEVELS } else { COARSE_LEVELS };
                    let level = coarse(kind, body, levels)?;
                    let slot = match kind.as_str() {
                        "agent" => &mut p.agent,
                        "node" => &mut p.node,
                        "operator" => &mut p.operator,
                        "quota" => &mut p.quota,
                        _ => &mut p.plugin,
                    };
                    *slot = (*slot).max(level);
                }
                _ => continue,
            }
            any = true;
        }
        if !any {
            return Err(PolicyError("Invalid policy".into()));
        }
        Ok(p)
    }
}

/// The capabilities a namespace rule grants (its `policy` expanded, then `capabilities`).
pub fn namespace_rule_capabilities(rule: &NamespaceRule) -> Vec<&str> {
    let mut out: Vec<&str> = match rule.policy.as_str() {
        "deny" => vec!["deny"],
        "read" => NAMESPACE_READ.to_vec(),
        "write" => NAMESPACE_READ.iter().chain(NAMESPACE_WRITE_EXTRA).copied().collect(),
        "scale" => NAMESPACE_SCALE.to_vec(),
        _ => Vec::new(),
    };
    out.extend(rule.capabilities.iter().map(String::as_str));
    out
}

/// The capabilities a `host_volume` or `node_pool` rule grants.
pub fn labelled_rule_capabilities<'a>(kind: &str, rule: &'a LabelledRule) -> Vec<&'a str> {
    let mut out: Vec<&str> = match (kind, rule.policy.as_str()) {
        (_, "deny") => vec!["deny"],
        ("host_volume", "read") => vec!["mount-readonly"],
        ("host_volume", "write") => vec!["mount-readonly", "mount-readwrite"],
        (_, "read") => vec!["read"],
        (_, "write") => vec!["read", "write", "delete"],
        _ => Vec::new(),
    };
    out.extend(rule.capabilities.iter().map(String::as_str));
    out
}

/// The capabilities a variables path rule grants: `read` adds `list`.
pub fn path_rule_capabilities(rule: &PathRule) -> BTreeSet<&str> {
    let mut out: BTreeSet<&str> = rule.capabilities.iter().map(String::as_str).collect();
    if out.contains("read") {
        out.insert("list");
    }
    out
}
