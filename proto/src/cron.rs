//! Checking cron specs the way Nomad's periodic jobs read them (hashicorp/cronexpr).
//!
//! A spec has five to seven whitespace-separated fields: an optional seconds field first
//! (when there are seven), minutes, hours, day of month, month, day of week, and an
//! optional year last (six or seven fields); fields past the seventh are ignored, as
//! cronexpr does. `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily` and `@hourly`
//! stand for their specs. Each field is a comma-separated list of `*` or `?`, a value, a
//! range `a-b`, or either with a step (`*/n`, `a/n`, `a-b/n`, 1 <= n <= the field's maximum).
//! Months and days of week may be named (`jan`, `january`, `mon`, `monday`, any case). The
//! day of month also takes `L`, `LW` and `<day>W`; the day of week `<day>L` and `<day>#<1-5>`.
//!
//! Only validation lives here: nomad-rs does not launch periodic jobs yet.

#[derive(Clone, Copy)]
struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
    /// Highest number a value may be written as (day of week accepts 7 for Sunday).
    max_written: u32,
}

const SECOND: Field = Field { name: "second", min: 0, max: 59, names: &[], max_written: 59 };
const MINUTE: Field = Field { name: "minute", min: 0, max: 59, names: &[], max_written: 59 };
const HOUR: Field = Field { name: "hour", min: 0, max: 23, names: &[], max_written: 23 };
const DAY_OF_MONTH: Field = Field { name: "day-of-month", min: 1, max: 31, names: &[], max_written: 31 };
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan",
        "feb",
        "mar",
        "apr",
        "may",
        "jun",
        "jul",
        "aug",
        "sep",
        "oct",
        "nov",
        "dec",
        "january",
        "february",
        "march",
        "april",
        "june",
        "july",
        "august",
        "september",
        "october",
        "november",
        "december",
    ],
    max_written: 12,
};
const DAY_OF_WEEK: Field = Field {
    name: "day-of-week",
    min: 0,
    max: 6,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat", "sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"],
    max_written: 7,
};
const YEAR: Field = Field { name: "year", min: 1970, max: 2099, names: &[], max_written: 2099 };

/// Checks a cron spec; the error says which field is wrong, as cronexpr's do.
pub fn validate_cron(spec: &str) -> Result<(), String> {
    let expanded = expand_alias(spec);
    let fields: Vec<&str> = expanded.split_ascii_whitespace().collect();
    if fields.len() < 5 {
        return Err("missing field(s)".to_string());
    }
    let n = fields.len().min(7);
    let mut order: Vec<Field> = Vec::with_capacity(7);
    if n == 7 {
        order.push(SECOND);
    }
    order.extend([MINUTE, HOUR, DAY_OF_MONTH, MONTH, DAY_OF_WEEK]);
    if n >= 6 {
        order.push(YEAR);
    }
    for (text, field) in fields.iter().zip(order) {
        check_field(text, field)?;
    }
    Ok(())
}

fn expand_alias(spec: &str) -> String {
    const ALIASES: [(&str, &str); 6] = [
        ("@yearly", "0 0 0 1 1 * *"),
        ("@annually", "0 0 0 1 1 * *"),
        ("@monthly", "0 0 0 1 * * *"),
        ("@weekly", "0 0 0 * * 0 *"),
        ("@daily", "0 0 0 * * * *"),
        ("@hourly", "0 0 * * * * *"),
    ];
    let mut s = spec.to_string();
    for (alias, full) in ALIASES {
        s = s.replace(alias, full);
    }
    s
}

fn check_field(text: &str, f: Field) -> Result<(), String> {
    let entries: Vec<&str> = text.split(',').filter(|e| !e.is_empty()).collect();
    if entries.is_empty() {
        return Err(format!("{} field: missing directive", f.name));
    }
    for entry in entries {
        let lower = entry.to_ascii_lowercase();
        match generic(&lower, f)? {
            true => {}
            false if special(&lower, f) => {}
            false => return Err(format!("syntax error in {} field: '{entry}'", f.name)),
        }
    }
    Ok(())
}

/// `*`, `?`, a value, a range, or one of those with a step. `Ok(false)` when the entry is
/// none of these (it may still be a special form of its field).
fn generic(e: &str, f: Field) -> Result<bool, String> {
    let (base, step) = match e.split_once('/') {
        Some((b, s)) => (b, Some(s)),
        None => (e, None),
    };
    let base_ok = match base {
        "*" | "?" => step.is_none() || base == "*",
        _ => match base.split_once('-') {
            Some((a, b)) => value(a, f) && value(b, f),
            None => value(base, f),
        },
    };
    if !base_ok {
        return Ok(false);
    }
    if let Some(step) = step {
        if step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(false);
        }
        if !(1..=f.max).contains(&number_token(step)) {
            return Err(format!("invalid interval {e}"));
        }
    }
    Ok(true)
}

/// A number as cronexpr's table of numbers reads it: `0`-`59` (one or two digits) and
/// `1970`-`2099`; anything else reads as 0.
fn number_token(s: &str) -> u32 {
    let v: u32 = s.parse().unwrap_or(0);
    match s.len() {
        1 | 2 if v <= 59 => v,
        4 if (1970..=2099).contains(&v) => v,
        _ => 0,
    }
}

/// A single value of the field: a number with at most one leading zero, or a name.
fn value(s: &str, f: Field) -> bool {
    if f.names.contains(&s) {
        return true;
    }
    if s.is_empty() || s.len() > 4 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    // cronexpr's patterns take `05` but not `005`, except for years, which are four digits.
    if f.min == YEAR.min {
        return s.len() == 4 && s.parse::<u32>().is_ok_and(|v| (f.min..=f.max_written).contains(&v));
    }
    if s.len() > 2 {
        return false;
    }
    s.parse::<u32>().is_ok_and(|v| (f.min..=f.max_written).contains(&v))
}

fn special(e: &str, f: Field) -> bool {
    match f.name {
        "day-of-month" => e == "l" || e == "lw" || e.strip_suffix('w').is_some_and(|d| value(d, f)),
        "day-of-week" => {
            e.strip_suffix('l').is_some_and(|d| value(d, f))
                || e.split_once('#').is_some_and(|(d, w)| value(d, f) && matches!(w, "1" | "2" | "3" | "4" | "5"))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::validate_cron;

    #[test]
    fn specs_cron_accepts() {
        for spec in [
            "*/15 * * * *",
            "0 0 * * *",
            "0 9-17 * * mon-fri",
            "@daily",
            "@hourly",
            "30 0 1 JAN,jul *",
            "0 0 L * *",
            "0 0 LW * *",
            "0 0 15W * *",
            "0 0 * * 5L",
            "0 0 * * fri#3",
            "0 0 * * 7",
            "0 0 0 * * * 2030",
            "0 0 * * * 2030",
            "5-55/10 * ? * *",
            "00 05 * * *",
            "0 0 1 1 * * * ignored",
        ] {
            validate_cron(spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
        }
    }

    #[test]
    fn specs_cron_refuses_say_which_field() {
        for (spec, want) in [
            ("", "missing field(s)"),
            ("* * * *", "missing field(s)"),
            ("60 * * * *", "syntax error in minute field: '60'"),
            ("* 24 * * *", "syntax error in hour field: '24'"),
            ("* * 0 * *", "syntax error in day-of-month field: '0'"),
            ("* * * 13 *", "syntax error in month field: '13'"),
            ("* * * * 8", "syntax error in day-of-week field: '8'"),
            ("* * * * mon#6", "syntax error in day-of-week field: 'mon#6'"),
            ("*/0 * * * *", "invalid interval */0"),
            ("*/60 * * * *", "invalid interval */60"),
            ("not a cron at all", "syntax error in minute field: 'not'"),
            ("a b c d e", "syntax error in minute field: 'a'"),
            ("* * * * * 1969", "syntax error in year field: '1969'"),
            ("1-x * * * *", "syntax error in minute field: '1-x'"),
            ("60 * * * * * *", "syntax error in second field: '60'"),
            ("*/007 * * * *", "invalid interval */007"),
            ("?/5 * * * *", "syntax error in minute field: '?/5'"),
            (",,, * * * *", "minute field: missing directive"),
        ] {
            let got = validate_cron(spec).map(|_| "ok".to_string()).unwrap_or_else(|e| e);
            assert!(got.starts_with(want), "{spec:?}: got {got:?}, want {want:?}");
        }
    }
}
