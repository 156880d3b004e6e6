//! Cron specs the way Nomad's periodic jobs read them (hashicorp/cronexpr): checking them,
//! and finding the next time one matches.
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
//! [`CronSchedule::next_after`] works on civil (wall-clock) times with no zone: the caller
//! converts instants to and from the job's time zone.

use std::collections::BTreeSet;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Second,
    Minute,
    Hour,
    DayOfMonth,
    Month,
    DayOfWeek,
    Year,
}

#[derive(Clone, Copy)]
struct Field {
    kind: Kind,
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [(&'static str, u32)],
    /// Highest number a value may be written as (day of week accepts 7 for Sunday).
    max_written: u32,
}

const SECOND: Field = Field { kind: Kind::Second, name: "second", min: 0, max: 59, names: &[], max_written: 59 };
const MINUTE: Field = Field { kind: Kind::Minute, name: "minute", min: 0, max: 59, names: &[], max_written: 59 };
const HOUR: Field = Field { kind: Kind::Hour, name: "hour", min: 0, max: 23, names: &[], max_written: 23 };
const DAY_OF_MONTH: Field = Field { kind: Kind::DayOfMonth, name: "day-of-month", min: 1, max: 31, names: &[], max_written: 31 };
const MONTH: Field = Field {
    kind: Kind::Month,
    name: "month",
    min: 1,
    max: 12,
    names: &[
        ("jan", 1),
        ("feb", 2),
        ("mar", 3),
        ("apr", 4),
        ("may", 5),
        ("jun", 6),
        ("jul", 7),
        ("aug", 8),
        ("sep", 9),
        ("oct", 10),
        ("nov", 11),
        ("dec", 12),
        ("january", 1),
        ("february", 2),
        ("march", 3),
        ("april", 4),
        ("june", 6),
        ("july", 7),
        ("august", 8),
        ("september", 9),
        ("october", 10),
        ("november", 11),
        ("december", 12),
    ],
    max_written: 12,
};
const DAY_OF_WEEK: Field = Field {
    kind: Kind::DayOfWeek,
    name: "day-of-week",
    min: 0,
    max: 6,
    names: &[
        ("sun", 0),
        ("mon", 1),
        ("tue", 2),
        ("wed", 3),
        ("thu", 4),
        ("fri", 5),
        ("sat", 6),
        ("sunday", 0),
        ("monday", 1),
        ("tuesday", 2),
        ("wednesday", 3),
        ("thursday", 4),
        ("friday", 5),
        ("saturday", 6),
    ],
    max_written: 7,
};
const YEAR: Field = Field { kind: Kind::Year, name: "year", min: 1970, max: 2099, names: &[], max_written: 2099 };

/// A civil (wall-clock) date-time, no zone: what cron fields match against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CivilTime {
    /// The year; only 1970..=2099 can match.
    pub year: i32,
    /// 1..=12.
    pub month: u8,
    /// 1..=31.
    pub day: u8,
    /// 0..=23.
    pub hour: u8,
    /// 0..=59.
    pub minute: u8,
    /// 0..=59.
    pub second: u8,
}

/// A set of values of any field but the year, one bit per value: bit `v` stands for `v`.
type Bits = u64;

/// A parsed cron spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronSchedule {
    seconds: Bits,
    minutes: Bits,
    hours: Bits,
    months: Bits,
    /// 1970..=2099 is 130 values, too many for one bit mask; an ordered set is simplest.
    years: BTreeSet<i32>,
    days: DayRule,
}

/// Which days of a month match; it depends on the month, so it is kept as a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DayRule {
    /// False when the day-of-month field holds `*` or `?`: it then leaves the choice to the
    /// day of week. When both fields are restricted, a day matching either one matches.
    dom_restricted: bool,
    /// Plain days of month (bits 1..=31).
    dom_days: Bits,
    /// `L`.
    last_day: bool,
    /// `LW`.
    last_weekday: bool,
    /// `<d>W`, by `d`.
    nearest_weekday: Bits,
    /// As `dom_restricted`, for the day-of-week field.
    dow_restricted: bool,
    /// Plain days of week (bit 0 = Sunday).
    weekdays: Bits,
    /// `<d>L`, by `d`.
    last_of_week: Bits,
    /// `<d>#<k>`, at bit `(k - 1) * 7 + d`.
    nth_of_week: Bits,
}

/// One comma-separated entry of a field.
enum Entry {
    /// `*` or `?`.
    Every,
    /// A value, a range or a stepped form, as the values it stands for.
    Values(Vec<u32>),
    /// `L` (day of month).
    LastDay,
    /// `LW` (day of month).
    LastWeekday,
    /// `<d>W` (day of month).
    NearestWeekday(u32),
    /// `<d>L` (day of week).
    LastOfWeek(u32),
    /// `<d>#<k>` (day of week).
    NthOfWeek { weekday: u32, nth: u32 },
}

/// Checks a cron spec; the error says which field is wrong, as cronexpr's do.
pub fn validate_cron(spec: &str) -> Result<(), String> {
    CronSchedule::parse(spec).map(|_| ())
}

impl CronSchedule {
    /// Parses a spec; the errors are [`validate_cron`]'s.
    pub fn parse(spec: &str) -> Result<CronSchedule, String> {
        let expanded = expand_alias(spec);
        let fields: Vec<&str> = expanded.split_ascii_whitespace().collect();
        if fields.len() < 5 {
            return Err("missing field(s)".to_string());
        }
        let n = fields.len().min(7);
        // With seven fields the first is seconds; with fewer, jobs fire on second 0.
        let (seconds, rest) = match n {
            7 => (mask(&simple_field(fields[0], SECOND)?), &fields[1..]),
            _ => (1, &fields[..]),
        };
        let minutes = mask(&simple_field(rest[0], MINUTE)?);
        let hours = mask(&simple_field(rest[1], HOUR)?);
        let dom = parse_field(rest[2], DAY_OF_MONTH)?;
        let months = mask(&simple_field(rest[3], MONTH)?);
        let dow = parse_field(rest[4], DAY_OF_WEEK)?;
        // With six or seven fields the last is the year; with five, every year.
        let years = match n {
            6 | 7 => simple_field(rest[5], YEAR)?,
            _ => (YEAR.min..=YEAR.max).collect(),
        };
        let years = years.into_iter().map(|y| y as i32).collect();

        let mut days = DayRule {
            dom_restricted: true,
            dom_days: 0,
            last_day: false,
            last_weekday: false,
            nearest_weekday: 0,
            dow_restricted: true,
            weekdays: 0,
            last_of_week: 0,
            nth_of_week: 0,
        };
        for entry in dom {
            match entry {
                Entry::Every => days.dom_restricted = false,
                Entry::Values(values) => days.dom_days |= mask(&values),
                Entry::LastDay => days.last_day = true,
                Entry::LastWeekday => days.last_weekday = true,
                Entry::NearestWeekday(d) => days.nearest_weekday |= 1 << d,
                // Day-of-week forms are never parsed in this field.
                Entry::LastOfWeek(_) | Entry::NthOfWeek { .. } => {}
            }
        }
        for entry in dow {
            match entry {
                Entry::Every => days.dow_restricted = false,
                Entry::Values(values) => days.weekdays |= mask(&values),
                Entry::LastOfWeek(d) => days.last_of_week |= 1 << d,
                Entry::NthOfWeek { weekday, nth } => days.nth_of_week |= 1 << ((nth - 1) * 7 + weekday),
                // Day-of-month forms are never parsed in this field.
                Entry::LastDay | Entry::LastWeekday | Entry::NearestWeekday(_) => {}
            }
        }
        Ok(CronSchedule { seconds, minutes, hours, months, years, days })
    }

    /// The first civil time strictly after `after` that matches, or None when there is none
    /// up to year 2099.
    ///
    /// Walks year → month → day → time of day over the value sets, so a search costs at most
    /// a few thousand month visits even when nothing ever matches. `after` need not be a
    /// valid date: out-of-range fields simply have no matching values at or above them.
    pub fn next_after(&self, after: CivilTime) -> Option<CivilTime> {
        // An empty time-of-day field (e.g. minutes `50-10`) never matches; stop at once.
        let start_of_day = (lowest(self.hours)?, lowest(self.minutes)?, lowest(self.seconds)?);

        // While the year (then month, then day) equals `after`'s, the search is bounded
        // below by `after`; once past it, any value of the lower fields will do.
        for &year in self.years.range(after.year..) {
            let same_year = year == after.year;
            let mut month_from = if same_year { u32::from(after.month) } else { 1 };
            while let Some(month) = next_bit(self.months, month_from) {
                let same_month = same_year && month == u32::from(after.month);
                let days = self.days.days_of(year, month);
                let mut day_from = if same_month { u32::from(after.day) } else { 1 };
                while let Some(day) = next_bit(days, day_from) {
                    let time = if same_month && day == u32::from(after.day) {
                        self.time_after(u32::from(after.hour), u32::from(after.minute), u32::from(after.second))
                    } else {
                        Some(start_of_day)
                    };
                    if let Some((hour, minute, second)) = time {
                        return Some(CivilTime {
                            year,
                            month: month as u8,
                            day: day as u8,
                            hour: hour as u8,
                            minute: minute as u8,
                            second: second as u8,
                        });
                    }
                    day_from = day + 1;
                }
                month_from = month + 1;
            }
        }
        None
    }

    /// The earliest matching (hour, minute, second) strictly after the given one, same day.
    fn time_after(&self, hour: u32, minute: u32, second: u32) -> Option<(u32, u32, u32)> {
        if has(self.hours, hour) {
            if has(self.minutes, minute)
                && let Some(s) = next_bit(self.seconds, second + 1)
            {
                return Some((hour, minute, s));
            }
            if let Some(m) = next_bit(self.minutes, minute + 1) {
                return Some((hour, m, lowest(self.seconds)?));
            }
        }
        let h = next_bit(self.hours, hour + 1)?;
        Some((h, lowest(self.minutes)?, lowest(self.seconds)?))
    }
}

impl DayRule {
    /// The days of the given month that match (bits 1..=31).
    fn days_of(&self, year: i32, month: u32) -> Bits {
        let len = days_in_month(year, month);
        // Bits 1..=len: days past the end of the month (31 April, 30 February) never match.
        let valid: Bits = ((1 << (len + 1)) - 1) & !1;
        if !self.dom_restricted && !self.dow_restricted {
            return valid;
        }
        let first_weekday = weekday(year, month, 1);
        let weekday_of = |day: u32| (first_weekday + day - 1) % 7;
        let mut days: Bits = 0;

        if self.dom_restricted {
            days |= self.dom_days & valid;
            if self.last_day {
                days |= 1 << len;
            }
            if self.last_weekday {
                days |= 1 << nearest_weekday(len, weekday_of(len), len);
            }
            let mut wanted = self.nearest_weekday & valid;
            while wanted != 0 {
                let day = wanted.trailing_zeros();
                wanted &= wanted - 1;
                days |= 1 << nearest_weekday(day, weekday_of(day), len);
            }
        }

        if self.dow_restricted {
            for day in 1..=len {
                if has(self.weekdays, weekday_of(day)) {
                    days |= 1 << day;
                }
            }
            let mut wanted = self.nth_of_week;
            while wanted != 0 {
                let bit = wanted.trailing_zeros();
                wanted &= wanted - 1;
                let (nth, wd) = (bit / 7 + 1, bit % 7);
                // The first such weekday, then whole weeks on; a 5th may fall past the end.
                let day = 1 + (wd + 7 - first_weekday) % 7 + 7 * (nth - 1);
                if day <= len {
                    days |= 1 << day;
                }
            }
            let mut wanted = self.last_of_week;
            while wanted != 0 {
                let wd = wanted.trailing_zeros();
                wanted &= wanted - 1;
                // Step back from the last day to the weekday wanted (always within 6 days).
                days |= 1 << (len - (weekday_of(len) + 7 - wd) % 7);
            }
        }
        days
    }
}

/// The weekday (Monday to Friday) nearest to `day`, never leaving its month: a Saturday
/// moves to Friday, or to Monday when it is the 1st; a Sunday moves to Monday, or to Friday
/// when it is the last day.
fn nearest_weekday(day: u32, weekday: u32, len: u32) -> u32 {
    match weekday {
        6 if day > 1 => day - 1,
        6 => day + 2,
        0 if day < len => day + 1,
        0 => day - 2,
        _ => day,
    }
}

fn is_leap(year: i32) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Day of week, 0 = Sunday (Sakamoto's method: a per-month offset, with January and
/// February counted in the previous year so the leap day comes last).
fn weekday(year: i32, month: u32, day: u32) -> u32 {
    const MONTH_OFFSET: [i32; 12] = [0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4];
    let y = if month < 3 { year - 1 } else { year };
    let w = y + y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400) + MONTH_OFFSET[month as usize - 1] + day as i32;
    w.rem_euclid(7) as u32
}

fn has(bits: Bits, value: u32) -> bool {
    value < Bits::BITS && bits >> value & 1 == 1
}

/// The smallest value in `bits` that is at least `from`.
fn next_bit(bits: Bits, from: u32) -> Option<u32> {
    if from >= Bits::BITS {
        return None;
    }
    let rest = bits & (Bits::MAX << from);
    (rest != 0).then(|| rest.trailing_zeros())
}

fn lowest(bits: Bits) -> Option<u32> {
    next_bit(bits, 0)
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

/// A field without special forms, as the values it matches.
fn simple_field(text: &str, f: Field) -> Result<Vec<u32>, String> {
    let mut values = Vec::new();
    for entry in parse_field(text, f)? {
        match entry {
            Entry::Every => values.extend(f.min..=f.max),
            Entry::Values(v) => values.extend(v),
            // Special forms are only parsed in the two day fields.
            _ => {}
        }
    }
    Ok(values)
}

/// The bit set of the given values.
fn mask(values: &[u32]) -> Bits {
    values.iter().fold(0, |bits, v| bits | 1 << v)
}

fn parse_field(text: &str, f: Field) -> Result<Vec<Entry>, String> {
    let entries: Vec<&str> = text.split(',').filter(|e| !e.is_empty()).collect();
    if entries.is_empty() {
        return Err(format!("{} field: missing directive", f.name));
    }
    let mut parsed = Vec::with_capacity(entries.len());
    for entry in entries {
        let lower = entry.to_ascii_lowercase();
        match generic(&lower, f)?.or_else(|| special(&lower, f)) {
            Some(e) => parsed.push(e),
            None => return Err(format!("syntax error in {} field: '{entry}'", f.name)),
        }
    }
    Ok(parsed)
}

/// `*`, `?`, a value, a range, or one of those with a step. `Ok(None)` when the entry is
/// none of these (it may still be a special form of its field).
fn generic(e: &str, f: Field) -> Result<Option<Entry>, String> {
    let (base, step) = match e.split_once('/') {
        Some((b, s)) => (b, Some(s)),
        None => (e, None),
    };
    let (first, last) = match base {
        "*" | "?" if step.is_none() => return Ok(Some(Entry::Every)),
        "*" => (f.min, f.max),
        "?" => return Ok(None),
        _ => match base.split_once('-') {
            Some((a, b)) => match (value(a, f), value(b, f)) {
                (Some(a), Some(b)) => (a, range_end(b, f)),
                _ => return Ok(None),
            },
            None => match value(base, f) {
                // `a/n` runs from a to the field's maximum.
                Some(v) if step.is_some() => (v, f.max),
                Some(v) => (v, v),
                None => return Ok(None),
            },
        },
    };
    let step = match step {
        None => 1,
        Some(step) => {
            if step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
                return Ok(None);
            }
            let n = number_token(step);
            if !(1..=f.max).contains(&n) {
                return Err(format!("invalid interval {e}"));
            }
            n
        }
    };
    // A range whose start is past its end is empty: cronexpr does not wrap `50-10`.
    Ok(Some(Entry::Values((first..=last).step_by(step as usize).collect())))
}

/// The end of a range as cronexpr reads it. A day-of-week range ending in Sunday (`0` or
/// `7`, which both read as 0) runs to Saturday instead, so `5-7` is Friday and Saturday
/// only, and `sun-sun` every day: cronexpr's reading, kept so jobs launch when Nomad's do.
fn range_end(last: u32, f: Field) -> u32 {
    match f.kind {
        Kind::DayOfWeek if last == 0 => f.max,
        _ => last,
    }
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

/// A single value of the field, as the number it stands for: a number with at most one
/// leading zero, or a name.
fn value(s: &str, f: Field) -> Option<u32> {
    if let Some(&(_, v)) = f.names.iter().find(|(name, _)| *name == s) {
        return Some(v);
    }
    if s.is_empty() || s.len() > 4 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: u32 = s.parse().ok()?;
    // cronexpr's patterns take `05` but not `005`, except for years, which are four digits.
    let fits = match f.kind {
        Kind::Year => s.len() == 4,
        _ => s.len() <= 2,
    };
    if !fits || !(f.min..=f.max_written).contains(&v) {
        return None;
    }
    match f.kind {
        // 7 is Sunday. cronexpr's day-of-week table also lacks the zero-padded numbers it
        // accepts, so `00`-`07` all read as 0, Sunday; kept so jobs launch when Nomad's do.
        Kind::DayOfWeek if v == 7 || s.len() == 2 => Some(0),
        _ => Some(v),
    }
}

fn special(e: &str, f: Field) -> Option<Entry> {
    match f.kind {
        Kind::DayOfMonth => match e {
            "l" => Some(Entry::LastDay),
            "lw" => Some(Entry::LastWeekday),
            _ => e.strip_suffix('w').and_then(|d| value(d, f)).map(Entry::NearestWeekday),
        },
        Kind::DayOfWeek => {
            if let Some(d) = e.strip_suffix('l').and_then(|d| value(d, f)) {
                return Some(Entry::LastOfWeek(d));
            }
            let (d, nth) = e.split_once('#')?;
            let nth = match nth {
                "1" | "2" | "3" | "4" | "5" => nth.parse().ok()?,
                _ => return None,
            };
            Some(Entry::NthOfWeek { weekday: value(d, f)?, nth })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::validate_cron;
    use super::{CivilTime, CronSchedule, days_in_month, weekday};

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

    fn at(year: i32, month: u8, day: u8, hour: u8, minute: u8, second: u8) -> CivilTime {
        CivilTime { year, month, day, hour, minute, second }
    }

    fn next(spec: &str, after: CivilTime) -> Option<CivilTime> {
        CronSchedule::parse(spec).unwrap_or_else(|e| panic!("{spec:?}: {e}")).next_after(after)
    }

    /// Asserts each (after, want) pair for one spec.
    fn check(spec: &str, cases: &[(CivilTime, Option<CivilTime>)]) {
        for &(after, want) in cases {
            assert_eq!(next(spec, after), want, "{spec:?} after {after:?}");
        }
    }

    #[test]
    fn parse_errors_are_validate_errors() {
        for spec in ["* * * *", "60 * * * *", "*/0 * * * *", "* * * * mon#6", "* * 32W * *", "0 0 L * 5W"] {
            let err = CronSchedule::parse(spec).unwrap_err();
            assert_eq!(validate_cron(spec), Err(err), "{spec:?}");
        }
    }

    #[test]
    fn calendar_helpers() {
        // Known anchors: 1970-01-01 Thursday, 2026-12-06 Sunday, 2025-11-15 Saturday,
        // 2000-02-29 Tuesday (2000 is a leap year: divisible by 400).
        assert_eq!(weekday(1970, 1, 1), 4);
        assert_eq!(weekday(2026, 12, 6), 0);
        assert_eq!(weekday(2025, 11, 15), 6);
        assert_eq!(weekday(2000, 2, 29), 2);
        assert_eq!(days_in_month(2024, 2), 29);
        assert_eq!(days_in_month(2025, 2), 28);
        assert_eq!(days_in_month(2000, 2), 29);
        assert_eq!(days_in_month(2100, 2), 28);
        assert_eq!(days_in_month(2026, 4), 30);
        assert_eq!(days_in_month(2026, 12), 31);
    }

    #[test]
    fn every_minute_and_steps() {
        check("* * * * *", &[(at(2026, 3, 10, 10, 0, 30), Some(at(2026, 3, 10, 10, 1, 0)))]);
        check(
            "*/15 * * * *",
            &[
                (at(2026, 3, 10, 10, 7, 0), Some(at(2026, 3, 10, 10, 15, 0))),
                (at(2026, 3, 10, 10, 45, 0), Some(at(2026, 3, 10, 11, 0, 0))),
                (at(2026, 3, 10, 23, 50, 0), Some(at(2026, 3, 11, 0, 0, 0))),
            ],
        );
        // `a/n` runs from a to the maximum; `a-b/n` stays within the range.
        check("50/5 * * * *", &[(at(2026, 3, 10, 10, 56, 0), Some(at(2026, 3, 10, 11, 50, 0)))]);
        check("0 9-17/4 * * *", &[(at(2026, 3, 10, 13, 0, 0), Some(at(2026, 3, 10, 17, 0, 0)))]);
        check("0 9-17/4 * * *", &[(at(2026, 3, 10, 17, 0, 0), Some(at(2026, 3, 11, 9, 0, 0)))]);
    }

    #[test]
    fn six_fields_end_with_a_year() {
        check("0 12 1 1 * 2030", &[(at(2026, 5, 5, 0, 0, 0), Some(at(2030, 1, 1, 12, 0, 0))), (at(2030, 1, 1, 12, 0, 0), None)]);
        check("0 0 1 1 * 2025", &[(at(2026, 1, 1, 0, 0, 0), None)]);
        check("0 0 1 1 * 2028-2040/4", &[(at(2028, 1, 1, 0, 0, 0), Some(at(2032, 1, 1, 0, 0, 0)))]);
    }

    #[test]
    fn seven_fields_start_with_seconds() {
        check(
            "*/5 * * * * * *",
            &[(at(2026, 3, 10, 10, 0, 3), Some(at(2026, 3, 10, 10, 0, 5))), (at(2026, 3, 10, 10, 0, 55), Some(at(2026, 3, 10, 10, 1, 0)))],
        );
        check("30 15 10 * * * 2027", &[(at(2026, 3, 10, 10, 15, 30), Some(at(2027, 1, 1, 10, 15, 30)))]);
        // An eighth field is ignored.
        check("0 0 0 1 1 * * junk", &[(at(2026, 3, 10, 0, 0, 0), Some(at(2027, 1, 1, 0, 0, 0)))]);
    }

    #[test]
    fn last_day_of_month() {
        check(
            "0 0 L * *",
            &[
                (at(2024, 2, 10, 0, 0, 0), Some(at(2024, 2, 29, 0, 0, 0))),
                (at(2025, 2, 10, 0, 0, 0), Some(at(2025, 2, 28, 0, 0, 0))),
                (at(2024, 4, 30, 0, 0, 0), Some(at(2024, 5, 31, 0, 0, 0))),
            ],
        );
    }

    #[test]
    fn last_weekday_of_month() {
        check(
            "0 0 LW * *",
            &[
                // 2026-01-31 is a Saturday: Friday the 30th.
                (at(2026, 1, 1, 0, 0, 0), Some(at(2026, 1, 30, 0, 0, 0))),
                // 2026-05-31 is a Sunday: Friday the 29th.
                (at(2026, 5, 1, 0, 0, 0), Some(at(2026, 5, 29, 0, 0, 0))),
                // 2026-06-30 is a Tuesday: the day itself.
                (at(2026, 6, 1, 0, 0, 0), Some(at(2026, 6, 30, 0, 0, 0))),
            ],
        );
    }

    #[test]
    fn nearest_weekday_stays_in_month() {
        // 2025-11-15 is a Saturday: Friday the 14th.
        check("0 0 15W * *", &[(at(2025, 11, 1, 0, 0, 0), Some(at(2025, 11, 14, 0, 0, 0)))]);
        // 2026-03-15 is a Sunday: Monday the 16th.
        check("0 0 15W * *", &[(at(2026, 3, 1, 0, 0, 0), Some(at(2026, 3, 16, 0, 0, 0)))]);
        // 2025-11-01 is a Saturday: Friday would be October, so Monday the 3rd.
        check("0 0 1W * *", &[(at(2025, 10, 31, 12, 0, 0), Some(at(2025, 11, 3, 0, 0, 0)))]);
        // 2025-08-31 is a Sunday: Monday would be September, so Friday the 29th.
        check("0 0 31W * *", &[(at(2025, 8, 1, 0, 0, 0), Some(at(2025, 8, 29, 0, 0, 0)))]);
        // A weekday stays put; a day the month lacks is skipped (no 31st in September).
        check("0 0 31W * *", &[(at(2025, 9, 1, 0, 0, 0), Some(at(2025, 10, 31, 0, 0, 0)))]);
    }

    #[test]
    fn last_weekday_of_kind() {
        check(
            "0 0 * * 5L",
            &[
                // Fridays of March 2026: 6, 13, 20, 27.
                (at(2026, 3, 1, 0, 0, 0), Some(at(2026, 3, 27, 0, 0, 0))),
                // May 2026 ends on Sunday the 31st: last Friday the 29th.
                (at(2026, 3, 27, 0, 0, 0), Some(at(2026, 4, 24, 0, 0, 0))),
                (at(2026, 5, 1, 0, 0, 0), Some(at(2026, 5, 29, 0, 0, 0))),
            ],
        );
    }

    #[test]
    fn nth_weekday_of_month() {
        // Fridays of March 2026: 6, 13, 20, 27 (any case of name).
        check("0 0 * * FRI#3", &[(at(2026, 3, 1, 0, 0, 0), Some(at(2026, 3, 20, 0, 0, 0)))]);
        check("0 0 * * fri#3", &[(at(2026, 3, 20, 0, 0, 0), Some(at(2026, 4, 17, 0, 0, 0)))]);
        // Mondays in 2026: March has 2, 9, 16, 23, 30; April, May 5 to 25 and June 1 to 29.
        check(
            "0 0 * * mon#5",
            &[(at(2026, 3, 1, 0, 0, 0), Some(at(2026, 3, 30, 0, 0, 0))), (at(2026, 3, 30, 0, 0, 0), Some(at(2026, 6, 29, 0, 0, 0)))],
        );
    }

    #[test]
    fn day_of_month_and_week_both_restricted_is_a_union() {
        // March 2026: the 13th is a Friday; Fridays are 6, 13, 20, 27.
        check(
            "0 0 13 * fri",
            &[
                (at(2026, 3, 1, 0, 0, 0), Some(at(2026, 3, 6, 0, 0, 0))),
                (at(2026, 3, 6, 0, 0, 0), Some(at(2026, 3, 13, 0, 0, 0))),
                (at(2026, 3, 27, 0, 0, 0), Some(at(2026, 4, 3, 0, 0, 0))),
                // April 2026 Fridays: 3, 10, 17, 24; the 13th is a Monday.
                (at(2026, 4, 10, 0, 0, 0), Some(at(2026, 4, 13, 0, 0, 0))),
            ],
        );
        // Only one restricted: only it counts. `?` is as unrestricted as `*`.
        check("0 0 13 * *", &[(at(2026, 3, 1, 0, 0, 0), Some(at(2026, 3, 13, 0, 0, 0)))]);
        check("0 0 ? * fri", &[(at(2026, 3, 7, 0, 0, 0), Some(at(2026, 3, 13, 0, 0, 0)))]);
        // `*/1` is a step, not `*`: the day of month is restricted (to every day), so the
        // union is every day.
        check("0 0 */1 * fri", &[(at(2026, 3, 7, 0, 0, 0), Some(at(2026, 3, 8, 0, 0, 0)))]);
        // `*` anywhere in the list leaves the field unrestricted.
        check("0 0 13 * fri,*", &[(at(2026, 3, 1, 0, 0, 0), Some(at(2026, 3, 13, 0, 0, 0)))]);
    }

    #[test]
    fn leap_days_and_impossible_dates() {
        check(
            "0 0 29 2 *",
            &[
                (at(2024, 3, 1, 0, 0, 0), Some(at(2028, 2, 29, 0, 0, 0))),
                (at(2024, 2, 29, 0, 0, 0), Some(at(2028, 2, 29, 0, 0, 0))),
                // 2096 is the last leap year before the range ends.
                (at(2096, 3, 1, 0, 0, 0), None),
            ],
        );
        check("0 0 30 2 *", &[(at(2026, 1, 1, 0, 0, 0), None)]);
        check("0 0 31 4,6,9,11 *", &[(at(2026, 1, 1, 0, 0, 0), None)]);
        // A range whose start is past its end is empty: nothing matches.
        check("50-10 * * * *", &[(at(2026, 1, 1, 0, 0, 0), None)]);
        check("0 0 20-10 * *", &[(at(2026, 1, 1, 0, 0, 0), None)]);
    }

    #[test]
    fn never_or_far_matches_answer_fast() {
        let start = std::time::Instant::now();
        for (spec, want) in [
            ("0 0 30 2 *", None),
            ("0 0 0 31 2 * *", None),
            ("0 0 0 1 1 * 2099", Some(at(2099, 1, 1, 0, 0, 0))),
            ("0 0 29 2 *", Some(at(2028, 2, 29, 0, 0, 0))),
            ("* * 20-10 * *", None),
        ] {
            assert_eq!(next(spec, at(2026, 3, 10, 0, 0, 0)), want, "{spec:?}");
        }
        // A loose bound (debug build, busy machine); each search is microseconds.
        assert!(start.elapsed() < std::time::Duration::from_millis(200), "{:?}", start.elapsed());
    }

    #[test]
    fn strictly_after() {
        check("0 0 * * *", &[(at(2026, 3, 10, 0, 0, 0), Some(at(2026, 3, 11, 0, 0, 0)))]);
        check("30 * * * * * *", &[(at(2026, 3, 10, 8, 15, 30), Some(at(2026, 3, 10, 8, 16, 30)))]);
        check("0 0 0 1 1 * 2099", &[(at(2099, 1, 1, 0, 0, 0), None)]);
        // Before 1970, the first match is in 1970; after 2099 there is none.
        check("0 0 1 1 *", &[(at(1900, 6, 1, 0, 0, 0), Some(at(1970, 1, 1, 0, 0, 0)))]);
        check("* * * * *", &[(at(2100, 1, 1, 0, 0, 0), None)]);
        check("* * * * *", &[(at(2099, 12, 31, 23, 59, 0), None)]);
    }

    #[test]
    fn rollover_at_year_end() {
        check("* * * * * * *", &[(at(2026, 12, 31, 23, 59, 59), Some(at(2027, 1, 1, 0, 0, 0)))]);
        check("0 0 1 * *", &[(at(2026, 12, 31, 23, 59, 59), Some(at(2027, 1, 1, 0, 0, 0)))]);
        check("59 23 31 12 *", &[(at(2026, 12, 31, 23, 59, 0), Some(at(2027, 12, 31, 23, 59, 0)))]);
        check("0 0 1 * *", &[(at(2026, 1, 31, 23, 59, 59), Some(at(2026, 2, 1, 0, 0, 0)))]);
    }

    #[test]
    fn aliases() {
        // 2026-12-02 is a Wednesday; 2026-12-06 a Sunday.
        check("@weekly", &[(at(2026, 12, 2, 9, 0, 0), Some(at(2026, 12, 6, 0, 0, 0)))]);
        check("@weekly", &[(at(2026, 12, 6, 0, 0, 0), Some(at(2026, 12, 13, 0, 0, 0)))]);
        check("@daily", &[(at(2026, 12, 2, 9, 0, 0), Some(at(2026, 12, 3, 0, 0, 0)))]);
        check("@hourly", &[(at(2026, 12, 2, 9, 0, 0), Some(at(2026, 12, 2, 10, 0, 0)))]);
        check("@monthly", &[(at(2026, 12, 2, 9, 0, 0), Some(at(2027, 1, 1, 0, 0, 0)))]);
        check("@yearly", &[(at(2026, 12, 2, 9, 0, 0), Some(at(2027, 1, 1, 0, 0, 0)))]);
        check("@annually", &[(at(2026, 12, 2, 9, 0, 0), Some(at(2027, 1, 1, 0, 0, 0)))]);
    }

    #[test]
    fn names_and_sunday_as_seven() {
        check("0 0 * * 7", &[(at(2026, 12, 2, 0, 0, 0), Some(at(2026, 12, 6, 0, 0, 0)))]);
        check("0 0 * * 0", &[(at(2026, 12, 2, 0, 0, 0), Some(at(2026, 12, 6, 0, 0, 0)))]);
        check("0 0 * * 7L", &[(at(2026, 12, 2, 0, 0, 0), Some(at(2026, 12, 27, 0, 0, 0)))]);
        check("0 0 * * 7#1", &[(at(2026, 12, 2, 0, 0, 0), Some(at(2026, 12, 6, 0, 0, 0)))]);
        // 2025-11-15 is a Saturday: the next weekday 09:00 is Monday the 17th.
        check("0 9 * * mon-fri", &[(at(2025, 11, 15, 10, 0, 0), Some(at(2025, 11, 17, 9, 0, 0)))]);
        check("0 9 * * Monday-Friday", &[(at(2025, 11, 14, 10, 0, 0), Some(at(2025, 11, 17, 9, 0, 0)))]);
        check("0 0 1 jan,jul *", &[(at(2026, 2, 1, 0, 0, 0), Some(at(2026, 7, 1, 0, 0, 0)))]);
        check("0 0 1 JAN,JUL *", &[(at(2026, 7, 1, 0, 0, 0), Some(at(2027, 1, 1, 0, 0, 0)))]);
        check("0 0 1 september-october/1 *", &[(at(2026, 2, 1, 0, 0, 0), Some(at(2026, 9, 1, 0, 0, 0)))]);
        check("0 0 1 04 *", &[(at(2026, 2, 1, 0, 0, 0), Some(at(2026, 4, 1, 0, 0, 0)))]);
    }

    #[test]
    fn cronexpr_day_of_week_quirks() {
        // cronexpr reads a day-of-week range ending in 7 (or 0) as ending on Saturday:
        // `5-7` is Friday and Saturday, not Sunday. 2026-12-04 is a Friday.
        check(
            "0 0 * * 5-7",
            &[(at(2026, 12, 4, 0, 0, 0), Some(at(2026, 12, 5, 0, 0, 0))), (at(2026, 12, 5, 0, 0, 0), Some(at(2026, 12, 11, 0, 0, 0)))],
        );
        // Zero-padded day-of-week numbers all read as Sunday in cronexpr.
        check("0 0 * * 05", &[(at(2026, 12, 2, 0, 0, 0), Some(at(2026, 12, 6, 0, 0, 0)))]);
    }

    /// A slow matcher written from the rules, not from the search: day by day, then the
    /// time of day value by value. Gives up past `until_year`.
    fn brute_force(s: &CronSchedule, after: CivilTime, until_year: i32) -> Option<CivilTime> {
        let has = |bits: u64, v: u32| bits >> v & 1 == 1;
        let is_weekday = |y: i32, m: u32, d: u32| (1..=5).contains(&weekday(y, m, d));
        let day_matches = |y: i32, m: u32, d: u32| {
            let r = &s.days;
            let len = days_in_month(y, m);
            let wd = weekday(y, m, d);
            let dom = has(r.dom_days, d)
                || (r.last_day && d == len)
                || (r.last_weekday && is_weekday(y, m, d) && (d + 1..=len).all(|e| !is_weekday(y, m, e)))
                || (1..=len).any(|w| {
                    // The in-month weekday closest to w.
                    has(r.nearest_weekday, w) && (1..=len).filter(|&c| is_weekday(y, m, c)).min_by_key(|&c| c.abs_diff(w)) == Some(d)
                });
            let dow = has(r.weekdays, wd) || (has(r.last_of_week, wd) && d + 7 > len) || has(r.nth_of_week, ((d - 1) / 7) * 7 + wd);
            match (r.dom_restricted, r.dow_restricted) {
                (false, false) => true,
                (true, false) => dom,
                (false, true) => dow,
                (true, true) => dom || dow,
            }
        };
        for y in after.year.max(1970)..=until_year {
            if !s.years.contains(&y) {
                continue;
            }
            for m in 1..=12u32 {
                if !has(s.months, m) {
                    continue;
                }
                for d in 1..=days_in_month(y, m) {
                    let t = |h: u32, mi: u32, se: u32| CivilTime {
                        year: y,
                        month: m as u8,
                        day: d as u8,
                        hour: h as u8,
                        minute: mi as u8,
                        second: se as u8,
                    };
                    // Skip whole days, hours and minutes that end before `after` (speed only).
                    if t(23, 59, 59) <= after || !day_matches(y, m, d) {
                        continue;
                    }
                    for h in (0..24u32).filter(|&h| has(s.hours, h) && t(h, 59, 59) > after) {
                        for mi in (0..60u32).filter(|&mi| has(s.minutes, mi) && t(h, mi, 59) > after) {
                            for se in (0..60u32).filter(|&se| has(s.seconds, se)) {
                                if t(h, mi, se) > after {
                                    return Some(t(h, mi, se));
                                }
                            }
                        }
                    }
                }
            }
        }
        None
    }

    #[test]
    fn search_agrees_with_brute_force() {
        const SECONDS: &[&str] = &["0", "*/20", "59", "10-12"];
        const MINUTES: &[&str] = &["*", "0", "*/7", "30-35", "59", "5,50"];
        const HOURS: &[&str] = &["*", "0", "23", "9-17/4", "12"];
        const DOMS: &[&str] = &["*", "?", "1", "31", "L", "LW", "15W", "1W", "31W", "29", "10-20/5", "L,1", "30W", "*/1"];
        const MONTHS: &[&str] = &["*", "2", "jan,jul", "4-6", "dec", "*/5"];
        const DOWS: &[&str] = &["*", "?", "0", "7", "mon-fri", "5L", "fri#3", "mon#5", "sat,sun", "2#1,4L", "5-7"];
        const YEARS: &[&str] = &["*", "2027", "2025-2030/2"];
        // A fixed xorshift sequence: varied but reproducible.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut pick = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for _ in 0..1000 {
            let spec = format!(
                "{} {} {} {} {} {} {}",
                SECONDS[pick(SECONDS.len())],
                MINUTES[pick(MINUTES.len())],
                HOURS[pick(HOURS.len())],
                DOMS[pick(DOMS.len())],
                MONTHS[pick(MONTHS.len())],
                DOWS[pick(DOWS.len())],
                YEARS[pick(YEARS.len())],
            );
            let schedule = CronSchedule::parse(&spec).unwrap_or_else(|e| panic!("{spec:?}: {e}"));
            for _ in 0..4 {
                let after =
                    at(2024 + pick(4) as i32, 1 + pick(12) as u8, 1 + pick(28) as u8, pick(24) as u8, pick(60) as u8, pick(60) as u8);
                let mut chained = after;
                // Follow a few launches in a row, as a periodic job would.
                for _ in 0..3 {
                    let want = brute_force(&schedule, chained, 2034);
                    let got = schedule.next_after(chained);
                    match want {
                        Some(_) => assert_eq!(got, want, "{spec:?} after {chained:?}"),
                        None => assert!(got.is_none_or(|t| t.year > 2034), "{spec:?} after {chained:?}: {got:?}"),
                    }
                    let Some(t) = want else { break };
                    chained = t;
                }
            }
        }
    }
}
