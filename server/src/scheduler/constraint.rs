//! Constraints and affinities compiled once per eval and checked per node.
//!
//! A target is a literal or an interpolation of the node (`${attr.*}`,
//! `${meta.*}`, `${node.unique.id}`, `${node.unique.name}`,
//! `${node.datacenter}`, `${node.class}`, `${node.pool}`); an unknown
//! interpolation never resolves. Operators follow Nomad's `checkConstraint`.

use nomad_proto::{Constraint, Node};
use regex::Regex;

use super::version::{Version, VersionConstraint};

/// Operand of a constraint spreading allocs over distinct nodes.
pub(crate) const DISTINCT_HOSTS: &str = "distinct_hosts";
/// Operand of a constraint limiting allocs per property value.
pub(crate) const DISTINCT_PROPERTY: &str = "distinct_property";

/// Where a constraint side takes its value from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Literal(String),
    NodeId,
    NodeName,
    Datacenter,
    Class,
    Pool,
    Attr(String),
    Meta(String),
    Unresolvable,
}

impl Target {
    pub(crate) fn parse(s: &str) -> Target {
        let Some(inner) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}')) else {
            return if s.starts_with("${") { Target::Unresolvable } else { Target::Literal(s.to_string()) };
        };
        match inner {
            "node.unique.id" => Target::NodeId,
            "node.unique.name" => Target::NodeName,
            "node.datacenter" => Target::Datacenter,
            "node.class" => Target::Class,
            "node.pool" => Target::Pool,
            _ => {
                if let Some(a) = inner.strip_prefix("attr.") {
                    Target::Attr(a.to_string())
                } else if let Some(m) = inner.strip_prefix("meta.") {
                    Target::Meta(m.to_string())
                } else {
                    Target::Unresolvable
                }
            }
        }
    }

    /// The value on `node`, if the target resolves.
    pub(crate) fn resolve<'n>(&'n self, node: &'n Node) -> Option<&'n str> {
        match self {
            Target::Literal(s) => Some(s),
            Target::NodeId => Some(&node.id),
            Target::NodeName => Some(&node.name),
            Target::Datacenter => Some(&node.datacenter),
            Target::Class => Some(&node.node_class),
            Target::Pool => Some(&node.node_pool),
            Target::Attr(k) => node.attributes.get(k).map(String::as_str),
            Target::Meta(k) => node.meta.get(k).map(String::as_str),
            Target::Unresolvable => None,
        }
    }
}

/// True when a target defeats computed-class caching (it reads per-node values).
pub(crate) fn target_escapes(target: &str) -> bool {
    ["${node.unique.", "${attr.unique.", "${meta.unique."].iter().any(|p| target.starts_with(p))
}

/// True when the constraint cannot be judged by computed node class.
pub(crate) fn escapes(c: &Constraint) -> bool {
    target_escapes(&c.l_target) || target_escapes(&c.r_target)
}

#[derive(Debug, Clone)]
enum Check {
    Equal,
    NotEqual,
    Order(Ordering),
    IsSet,
    IsNotSet,
    Version(Option<VersionConstraint>),
    Semver(Option<VersionConstraint>),
    Regexp(Option<Regex>),
    SetContainsAll(Vec<String>),
    SetContainsAny(Vec<String>),
    /// Handled by their own iterators (distinct hosts/property).
    AlwaysTrue,
    Unknown,
}

#[derive(Debug, Clone, Copy)]
enum Ordering {
    Lt,
    Le,
    Gt,
    Ge,
}

/// A constraint ready to check against nodes.
#[derive(Debug, Clone)]
pub(crate) struct CompiledConstraint {
    /// `l op r`, the key of `ConstraintFiltered`.
    pub(crate) display: String,
    l: Target,
    r: Target,
    check: Check,
}

impl CompiledConstraint {
    pub(crate) fn new(c: &Constraint) -> CompiledConstraint {
        let l = Target::parse(&c.l_target);
        let r = Target::parse(&c.r_target);
        // Right sides that are literals can be parsed once.
        let literal = match &r {
            Target::Literal(s) => Some(s.as_str()),
            _ => None,
        };
        let check = match c.operand.as_str() {
            "=" | "==" | "is" => Check::Equal,
            "!=" | "not" => Check::NotEqual,
            "<" => Check::Order(Ordering::Lt),
            "<=" => Check::Order(Ordering::Le),
            ">" => Check::Order(Ordering::Gt),
            ">=" => Check::Order(Ordering::Ge),
            "is_set" => Check::IsSet,
            "is_not_set" => Check::IsNotSet,
            "version" => Check::Version(literal.and_then(VersionConstraint::parse)),
            "semver" => Check::Semver(literal.and_then(VersionConstraint::parse_semver)),
            "regexp" => Check::Regexp(literal.and_then(|s| Regex::new(s).ok())),
            "set_contains" | "set_contains_all" => Check::SetContainsAll(literal.map(split_set).unwrap_or_default()),
            "set_contains_any" => Check::SetContainsAny(literal.map(split_set).unwrap_or_default()),
            DISTINCT_HOSTS | DISTINCT_PROPERTY => Check::AlwaysTrue,
            _ => Check::Unknown,
        };
        CompiledConstraint { display: c.to_string(), l, r, check }
    }

    /// True when `node` meets the constraint.
    pub(crate) fn matches(&self, node: &Node) -> bool {
        let l = self.l.resolve(node);
        let r = self.r.resolve(node);
        match &self.check {
            // Missing values compare as empty strings, as in Nomad.
            Check::Equal => l.is_some() && r.is_some() && l == r,
            Check::NotEqual => l.unwrap_or("") != r.unwrap_or(""),
            Check::Order(o) => match (l, r) {
                (Some(l), Some(r)) => check_order(*o, l, r),
                _ => false,
            },
            Check::IsSet => l.is_some(),
            Check::IsNotSet => l.is_none(),
            Check::Version(c) => self.version_match(l, r, c.as_ref(), false),
            Check::Semver(c) => self.version_match(l, r, c.as_ref(), true),
            Check::Regexp(re) => match (l, r) {
                (Some(l), Some(r)) => match (re, &self.r) {
                    (Some(re), _) => re.is_match(l),
                    (None, Target::Literal(_)) => false,
                    (None, _) => Regex::new(r).is_ok_and(|re| re.is_match(l)),
                },
                _ => false,
            },
            Check::SetContainsAll(want) => self.set_match(l, r, want, true),
            Check::SetContainsAny(want) => self.set_match(l, r, want, false),
            Check::AlwaysTrue => true,
            Check::Unknown => false,
        }
    }
}

impl CompiledConstraint {
    fn version_match(&self, l: Option<&str>, r: Option<&str>, pre: Option<&VersionConstraint>, semver: bool) -> bool {
        let (Some(l), Some(r)) = (l, r) else { return false };
        let parsed;
        let c = match pre {
            Some(c) => c,
            // A literal that did not parse never matches.
            None if matches!(self.r, Target::Literal(_)) => return false,
            None => {
                parsed = if semver { VersionConstraint::parse_semver(r) } else { VersionConstraint::parse(r) };
                match &parsed {
                    Some(c) => c,
                    None => return false,
                }
            }
        };
        let v = if semver { Version::parse_semver(l) } else { Version::parse(l) };
        v.is_some_and(|v| c.check(&v))
    }

    fn set_match(&self, l: Option<&str>, r: Option<&str>, literal: &[String], all: bool) -> bool {
        let (Some(l), Some(r)) = (l, r) else { return false };
        let have = split_set(l);
        let owned;
        let want = if matches!(self.r, Target::Literal(_)) {
            literal
        } else {
            owned = split_set(r);
            &owned
        };
        if all { want.iter().all(|w| have.contains(w)) } else { want.iter().any(|w| have.contains(w)) }
    }
}

fn split_set(s: &str) -> Vec<String> {
    s.split(',').map(|p| p.trim().to_string()).collect()
}

/// Integers if both parse, else floats if both parse, else lexical.
fn check_order(o: Ordering, l: &str, r: &str) -> bool {
    fn cmp<T: PartialOrd>(o: Ordering, a: T, b: T) -> bool {
        match o {
            Ordering::Lt => a < b,
            Ordering::Le => a <= b,
            Ordering::Gt => a > b,
            Ordering::Ge => a >= b,
        }
    }
    if let (Ok(a), Ok(b)) = (l.parse::<i64>(), r.parse::<i64>()) {
        return cmp(o, a, b);
    }
    if let (Ok(a), Ok(b)) = (l.parse::<f64>(), r.parse::<f64>()) {
        return cmp(o, a, b);
    }
    cmp(o, l, r)
}
