//! Version matching for the `version` and `semver` constraint operators.
//!
//! `version` follows the lenient rules Nomad inherits from go-version:
//! `v1.2`, `1.2.3-beta.1+meta` and `1.2.3beta` all parse, missing segments
//! count as zero, and a pre-release only matches a constraint that names a
//! pre-release of the same base version (`~>` pessimistic operator too).
//! `semver` compares by semver precedence with no pre-release filtering and
//! at most three segments.

use std::cmp::Ordering;

/// A parsed version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Version {
    /// Numeric segments, padded with zeros to at least three.
    segments: Vec<u64>,
    /// How many segments were written.
    specified: usize,
    /// Pre-release, without the dash.
    pre: String,
}

impl Version {
    /// Parses leniently (go-version rules).
    pub(crate) fn parse(s: &str) -> Option<Version> {
        parse(s.trim(), usize::MAX)
    }

    /// Parses a semver-shaped version (one to three segments).
    pub(crate) fn parse_semver(s: &str) -> Option<Version> {
        parse(s.trim(), 3)
    }

    fn compare(&self, other: &Version) -> Ordering {
        let n = self.segments.len().max(other.segments.len());
        for i in 0..n {
            let a = self.segments.get(i).copied().unwrap_or(0);
            let b = other.segments.get(i).copied().unwrap_or(0);
            match a.cmp(&b) {
                Ordering::Equal => {}
                o => return o,
            }
        }
        compare_prereleases(&self.pre, &other.pre)
    }
}

fn parse(s: &str, max_segments: usize) -> Option<Version> {
    let s = s.strip_prefix('v').unwrap_or(s);
    // Split off build metadata; it never affects comparisons.
    let s = match s.split_once('+') {
        Some((head, meta)) if !meta.is_empty() && meta.split('.').all(valid_ident) => head,
        Some(_) => return None,
        None => s,
    };
    let core_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (core, rest) = s.split_at(core_end);
    if core.is_empty() || core.ends_with('.') {
        return None;
    }
    let mut segments = Vec::new();
    for part in core.split('.') {
        segments.push(part.parse::<u64>().ok()?);
    }
    if segments.len() > max_segments {
        return None;
    }
    let pre = match rest {
        "" => String::new(),
        r => {
            let p = r.strip_prefix('-').unwrap_or_else(|| if r.starts_with(|c: char| c.is_ascii_alphabetic()) { r } else { "" });
            if p.is_empty() || !p.split('.').all(valid_ident) {
                return None;
            }
            p.to_string()
        }
    };
    let specified = segments.len();
    while segments.len() < 3 {
        segments.push(0);
    }
    Some(Version { segments, specified, pre })
}

fn valid_ident(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '~')
}

fn compare_prereleases(a: &str, b: &str) -> Ordering {
    match (a.is_empty(), b.is_empty()) {
        (true, true) => return Ordering::Equal,
        (true, false) => return Ordering::Greater,
        (false, true) => return Ordering::Less,
        _ => {}
    }
    let (pa, pb): (Vec<&str>, Vec<&str>) = (a.split('.').collect(), b.split('.').collect());
    for i in 0..pa.len().max(pb.len()) {
        let (x, y) = (pa.get(i).copied().unwrap_or(""), pb.get(i).copied().unwrap_or(""));
        match compare_part(x, y) {
            Ordering::Equal => {}
            o => return o,
        }
    }
    Ordering::Equal
}

fn compare_part(a: &str, b: &str) -> Ordering {
    if a == b {
        return Ordering::Equal;
    }
    let (na, nb) = (a.parse::<i64>().ok(), b.parse::<i64>().ok());
    if a.is_empty() {
        return if nb.is_some() { Ordering::Less } else { Ordering::Greater };
    }
    if b.is_empty() {
        return if na.is_some() { Ordering::Greater } else { Ordering::Less };
    }
    match (na, nb) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Gt,
    Lt,
    Ge,
    Le,
    Pessimistic,
}

/// A parsed constraint such as `>= 1.2, < 3`.
#[derive(Debug, Clone)]
pub(crate) struct VersionConstraint {
    parts: Vec<(Op, Version)>,
    semver: bool,
}

impl VersionConstraint {
    /// Parses a `version` constraint (go-version syntax, `~>` allowed).
    pub(crate) fn parse(s: &str) -> Option<VersionConstraint> {
        Self::parse_with(s, false)
    }

    /// Parses a `semver` constraint (no `~>`).
    pub(crate) fn parse_semver(s: &str) -> Option<VersionConstraint> {
        Self::parse_with(s, true)
    }

    fn parse_with(s: &str, semver: bool) -> Option<VersionConstraint> {
        let mut parts = Vec::new();
        for raw in s.split(',') {
            let raw = raw.trim();
            let (op, rest) = split_op(raw, semver)?;
            let v = if semver { Version::parse_semver(rest)? } else { Version::parse(rest)? };
            parts.push((op, v));
        }
        Some(VersionConstraint { parts, semver })
    }

    /// True when `v` satisfies every part.
    pub(crate) fn check(&self, v: &Version) -> bool {
        self.parts.iter().all(|(op, c)| if self.semver { check_semver(*op, v, c) } else { check_version(*op, v, c) })
    }
}

fn split_op(raw: &str, semver: bool) -> Option<(Op, &str)> {
    const OPS: [(&str, Op); 9] = [
        ("~>", Op::Pessimistic),
        (">=", Op::Ge),
        ("=>", Op::Ge),
        ("<=", Op::Le),
        ("=<", Op::Le),
        ("!=", Op::Ne),
        (">", Op::Gt),
        ("<", Op::Lt),
        ("=", Op::Eq),
    ];
    for (text, op) in OPS {
        if let Some(rest) = raw.strip_prefix(text) {
            if semver && op == Op::Pessimistic {
                return None;
            }
            return Some((op, rest.trim_start()));
        }
    }
    if raw.is_empty() { None } else { Some((Op::Eq, raw)) }
}

/// A pre-release version only matches a constraint on a pre-release of the
/// same base version; a release version matches any.
fn prerelease_check(v: &Version, c: &Version) -> bool {
    match (v.pre.is_empty(), c.pre.is_empty()) {
        (false, false) => v.segments == c.segments,
        (false, true) => false,
        _ => true,
    }
}

fn check_version(op: Op, v: &Version, c: &Version) -> bool {
    let cmp = v.compare(c);
    match op {
        Op::Eq => cmp == Ordering::Equal,
        Op::Ne => cmp != Ordering::Equal,
        Op::Gt => prerelease_check(v, c) && cmp == Ordering::Greater,
        Op::Lt => prerelease_check(v, c) && cmp == Ordering::Less,
        Op::Ge => prerelease_check(v, c) && cmp != Ordering::Less,
        Op::Le => prerelease_check(v, c) && cmp != Ordering::Greater,
        Op::Pessimistic => {
            if !prerelease_check(v, c) || (!c.pre.is_empty() && v.pre.is_empty()) || cmp == Ordering::Less {
                return false;
            }
            let cs = c.segments.len();
            if cs > v.segments.len() {
                return false;
            }
            // All but the last written segment must match exactly.
            if (0..c.specified.saturating_sub(1)).any(|i| v.segments[i] != c.segments[i]) {
                return false;
            }
            c.segments[cs - 1] <= v.segments[cs - 1]
        }
    }
}

fn check_semver(op: Op, v: &Version, c: &Version) -> bool {
    let cmp = v.compare(c);
    match op {
        Op::Eq => cmp == Ordering::Equal,
        Op::Ne => cmp != Ordering::Equal,
        Op::Gt => cmp == Ordering::Greater,
        Op::Lt => cmp == Ordering::Less,
        Op::Ge => cmp != Ordering::Less,
        Op::Le => cmp != Ordering::Greater,
        Op::Pessimistic => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(v: &str, c: &str) -> bool {
        VersionConstraint::parse(c).unwrap().check(&Version::parse(v).unwrap())
    }

    fn semver(v: &str, c: &str) -> bool {
        VersionConstraint::parse_semver(c).unwrap().check(&Version::parse_semver(v).unwrap())
    }

    #[test]
    fn version_ranges_and_padding() {
        assert!(version("1.2.3", ">= 1.2, < 3"));
        assert!(version("v2.9", ">= 1.2, < 3"));
        assert!(!version("3.0.0", ">= 1.2, < 3"));
        assert!(version("1.2", "= 1.2.0"));
        assert!(version("1.2.0", "1.2"));
        assert!(version("0.9.1", "!= 1.0"));
    }

    #[test]
    fn version_prereleases_need_a_prerelease_constraint() {
        assert!(!version("1.3.0-beta1", ">= 1.2"));
        assert!(version("1.3.0-beta2", ">= 1.3.0-beta1"));
        assert!(!version("1.4.0-beta2", ">= 1.3.0-beta1"));
        assert!(version("1.3.0", ">= 1.3.0-beta1"));
    }

    #[test]
    fn pessimistic_operator() {
        assert!(version("1.2.9", "~> 1.2.3"));
        assert!(!version("1.3.0", "~> 1.2.3"));
        assert!(version("1.9", "~> 1.2"));
        assert!(!version("2.0", "~> 1.2"));
        assert!(!version("1.2.2", "~> 1.2.3"));
    }

    #[test]
    fn semver_compares_prereleases_by_precedence() {
        assert!(semver("1.3.0-beta1", ">= 1.2.0"));
        assert!(semver("1.0.0-alpha.1", "> 1.0.0-alpha"));
        assert!(semver("1.0.0-alpha.beta", "> 1.0.0-alpha.1"));
        assert!(!semver("1.0.0-rc.1", ">= 1.0.0"));
        assert!(VersionConstraint::parse_semver("~> 1.2").is_none());
        assert!(Version::parse_semver("1.2.3.4").is_none());
    }

    #[test]
    fn garbage_does_not_parse() {
        for bad in ["", "abc", "1..2", "1.2.", "1.2.3-", "1.2.3+"] {
            assert!(Version::parse(bad).is_none(), "{bad}");
        }
        assert!(VersionConstraint::parse(">= banana").is_none());
    }
}
