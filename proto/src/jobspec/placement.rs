//! `constraint`, `affinity` and `spread` blocks.

use crate::job::{Affinity, Constraint, Spread, SpreadTarget};

use super::error::DResult;
use super::reader::Reader;

/// Weight Nomad gives affinities and spreads that do not set one.
const DEFAULT_WEIGHT: i64 = 50;

/// Shorthand attributes that set the operator and the right-hand value at
/// once (`version = ">= 1.2"` is `operator = "version"`, `value = ">= 1.2"`),
/// in the order Nomad applies them (a later one wins).
const OPERATOR_SHORTHANDS: &[&str] = &["version", "semver", "regexp", "set_contains_any", "set_contains_all", "set_contains"];

/// Decodes `constraint { attribute operator value }` and its shorthands,
/// including `distinct_hosts = true` and `distinct_property = "${meta.rack}"`.
pub(crate) fn constraint(r: &Reader<'_>) -> DResult<Constraint> {
    let mut c = Constraint::default();
    r.set_string("attribute", &mut c.l_target)?;
    r.set_string("value", &mut c.r_target)?;
    r.set_string("operator", &mut c.operand)?;
    apply_shorthands(r, &mut c.operand, &mut c.r_target)?;
    if r.bool("distinct_hosts")? == Some(true) {
        c.operand = "distinct_hosts".to_string();
    }
    if let Some(property) = r.string("distinct_property")?.filter(|p| !p.is_empty()) {
        c.operand = "distinct_property".to_string();
        c.l_target = property;
    }
    r.finish()?;
    if c.operand.is_empty() {
        c.operand = "=".to_string();
    }
    Ok(c)
}

/// Decodes `affinity { attribute operator value weight }` and its shorthands.
pub(crate) fn affinity(r: &Reader<'_>) -> DResult<Affinity> {
    let mut a = Affinity { weight: DEFAULT_WEIGHT, ..Affinity::default() };
    r.set_string("attribute", &mut a.l_target)?;
    r.set_string("value", &mut a.r_target)?;
    r.set_string("operator", &mut a.operand)?;
    r.set_int("weight", &mut a.weight)?;
    apply_shorthands(r, &mut a.operand, &mut a.r_target)?;
    r.finish()?;
    if a.operand.is_empty() {
        a.operand = "=".to_string();
    }
    Ok(a)
}

fn apply_shorthands(r: &Reader<'_>, operand: &mut String, r_target: &mut String) -> DResult<()> {
    for &name in OPERATOR_SHORTHANDS {
        if let Some(value) = r.string(name)?.filter(|v| !v.is_empty()) {
            *operand = name.to_string();
            *r_target = value;
        }
    }
    Ok(())
}

/// Decodes `spread { attribute weight target "<value>" { percent } }`.
pub(crate) fn spread(r: &Reader<'_>) -> DResult<Spread> {
    let mut s = Spread { weight: DEFAULT_WEIGHT, ..Spread::default() };
    r.set_string("attribute", &mut s.attribute)?;
    r.set_int("weight", &mut s.weight)?;
    for target in r.blocks("target", 1)? {
        let tr = r.child(&target)?;
        let mut t = SpreadTarget { value: target.label().to_string(), percent: 0 };
        tr.set_int("percent", &mut t.percent)?;
        tr.finish()?;
        s.spread_target.push(t);
    }
    r.finish()?;
    Ok(s)
}
