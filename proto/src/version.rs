//! Checking `version` and `semver` constraint strings the way Nomad parses them
//! (hashicorp/go-version 1.6 for `version`, Nomad's semver copy of it for `semver`).
//!
//! A constraint is a comma-separated list of `<op> <version>` with optional spaces, where
//! `op` is empty, `=`, `!=`, `>`, `<`, `>=`, `<=` or, for `version` only, `~>`. A version is
//! `v?N(.N)*` (each N fitting an `i64`), then an optional pre-release, then optional build
//! metadata `+ident(.ident)*`, identifiers being `[0-9A-Za-z-~]+`. A `version` pre-release may
//! follow the numbers directly when it starts with a letter, `-` or `~` (`1.2beta`); a
//! `semver` one needs the `-` (`1.2.3-beta`).
//!
//! The scheduler matches versions with its own parser (`server/src/scheduler/version.rs`);
//! this module only decides what admission accepts, with Nomad's messages.

/// Checks a `version` (`semver == false`) or `semver` constraint; the error is Nomad's
/// `Malformed constraint: <part>`.
pub fn validate_version_constraint(s: &str, semver: bool) -> Result<(), String> {
    for part in s.split(',') {
        if !single(part, semver) {
            return Err(format!("Malformed constraint: {part}"));
        }
    }
    Ok(())
}

/// Go's `\s`: space, tab, newline, form feed, carriage return.
fn is_go_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0c' | '\r')
}

fn single(part: &str, semver: bool) -> bool {
    let p = part.trim_matches(is_go_space);
    // Longest operators first; a version never starts with an operator character, so the
    // first that matches is the only one that can.
    let ops: &[&str] = if semver { &["!=", ">=", "<=", "=", ">", "<"] } else { &["!=", ">=", "<=", "~>", "=", ">", "<"] };
    let rest = ops.iter().find_map(|op| p.strip_prefix(op)).unwrap_or(p);
    version(rest.trim_start_matches(is_go_space), semver)
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-' || c == '~'
}

fn idents(s: &str) -> bool {
    s.split('.').all(|i| !i.is_empty() && i.chars().all(ident_char))
}

fn version(s: &str, semver: bool) -> bool {
    let s = s.strip_prefix('v').unwrap_or(s);
    let (s, meta) = match s.split_once('+') {
        Some((head, meta)) => (head, Some(meta)),
        None => (s, None),
    };
    if meta.is_some_and(|m| !idents(m)) {
        return false;
    }
    let core_end = s.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(s.len());
    let (core, pre) = s.split_at(core_end);
    if core.is_empty() || !core.split('.').all(|n| !n.is_empty() && n.parse::<i64>().is_ok()) {
        return false;
    }
    if pre.is_empty() {
        return true;
    }
    let (first, rest) = match pre.split_once('.') {
        Some((f, r)) => (f, Some(r)),
        None => (pre, None),
    };
    let first_ok = if semver {
        first.strip_prefix('-').is_some_and(|f| !f.is_empty() && f.chars().all(ident_char))
    } else {
        first.starts_with(|c: char| c.is_ascii_alphabetic() || c == '-' || c == '~') && first.chars().all(ident_char)
    };
    first_ok && rest.is_none_or(idents)
}

#[cfg(test)]
mod tests {
    use super::validate_version_constraint as check;

    #[test]
    fn go_version_constraints() {
        for ok in
            [">= 1.2", "~> 1.2.3", "1.2.3", "v1.2", ">1.0, <2.0", " = 1.0-beta.1+build.5 ", "1.2beta", "1.2-", "!=0.1.0-rc1", "1.2.3.4.5"]
        {
            check(ok, false).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for bad in ["", ">= ", "=> 1.0", "1.", "1..2", "a.b", ">= 1.0,", "1.0+", "1.0 beta", "99999999999999999999", "1.2.3-be ta"] {
            assert_eq!(check(bad, false).unwrap_err(), format!("Malformed constraint: {}", bad.rsplit(',').next().unwrap()), "{bad:?}");
        }
    }

    #[test]
    fn semver_constraints_need_the_dash_and_refuse_pessimistic() {
        check(">= 1.2.3-beta.1", true).unwrap();
        check("1.2", true).unwrap();
        assert!(check("1.2beta", true).is_err());
        assert!(check("~> 1.2", true).is_err());
        assert!(check("1.2-", true).is_err());
    }
}
