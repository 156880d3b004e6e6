//! `formatdate` and `timeadd` (go-cty's stdlib): RFC 3339 timestamps that
//! keep their UTC offset, Terraform's date format verbs, Go durations.

use hcl::Value;

use super::strings;
use crate::time::{GoDurationError, civil_from_days, days_from_civil, go_duration_nanos};

const MONTHS: [&str; 12] =
    ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

pub(super) fn call(name: &str, args: &[Value]) -> Result<Value, String> {
    match name {
        "formatdate" => {
            let [spec, timestamp] = strings::<2>(args)?;
            let t = parse_rfc3339(&timestamp)?;
            formatdate(&spec, &t).map(Value::String)
        }
        "timeadd" => {
            let [timestamp, duration] = strings::<2>(args)?;
            let t = parse_rfc3339(&timestamp)?;
            let nanos = go_duration_nanos(&duration).map_err(|e| match e {
                GoDurationError::Invalid => format!("time: invalid duration \"{duration}\""),
                GoDurationError::MissingUnit => format!("time: missing unit in duration \"{duration}\""),
                GoDurationError::UnknownUnit(u) => format!("time: unknown unit \"{u}\" in duration \"{duration}\""),
            })?;
            let total = (t.unix_seconds as i128 * 1_000_000_000 + t.nanos as i128) + nanos as i128;
            let moved = Time {
                unix_seconds: total.div_euclid(1_000_000_000) as i64,
                nanos: total.rem_euclid(1_000_000_000) as u32,
                offset_seconds: t.offset_seconds,
            };
            if !(-62_135_596_800..=253_402_300_799).contains(&(moved.unix_seconds + i64::from(moved.offset_seconds))) {
                return Err("the resulting time is outside the years 0001 to 9999".to_string());
            }
            Ok(Value::String(moved.format_rfc3339()))
        }
        _ => unreachable!("{name} is not a date function"),
    }
}

/// An instant with the UTC offset it was written in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Time {
    unix_seconds: i64,
    nanos: u32,
    offset_seconds: i32,
}

/// The local calendar fields of a [`Time`].
struct Fields {
    year: i64,
    month: i64,
    day: i64,
    hour: i64,
    minute: i64,
    second: i64,
    weekday: usize,
}

impl Time {
    fn fields(&self) -> Fields {
        let local = self.unix_seconds + i64::from(self.offset_seconds);
        let days = local.div_euclid(86_400);
        let secs = local.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        Fields {
            year,
            month,
            day,
            hour: secs / 3600,
            minute: secs % 3600 / 60,
            second: secs % 60,
            // 1970-01-01 was a Thursday.
            weekday: (days + 4).rem_euclid(7) as usize,
        }
    }

    /// Go's `time.RFC3339` layout: no fraction, `Z` for a zero offset.
    pub(crate) fn format_rfc3339(&self) -> String {
        let f = self.fields();
        format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{}", f.year, f.month, f.day, f.hour, f.minute, f.second, self.offset(true, true))
    }

    /// The offset as `Z`/`-07:00` (`z_for_utc`), or `-0700` (no colon).
    fn offset(&self, z_for_utc: bool, colon: bool) -> String {
        if z_for_utc && self.offset_seconds == 0 {
            return "Z".to_string();
        }
        let sign = if self.offset_seconds < 0 { '-' } else { '+' };
        let abs = self.offset_seconds.unsigned_abs();
        let (h, m) = (abs / 3600, abs % 3600 / 60);
        if colon { format!("{sign}{h:02}:{m:02}") } else { format!("{sign}{h:02}{m:02}") }
    }
}

/// Go's `time.Parse(time.RFC3339, s)`, with cty's messages naming the part that is wrong.
pub(crate) fn parse_rfc3339(s: &str) -> Result<Time, String> {
    let b = s.as_bytes();
    let mut at = 0usize;
    let mut digits = |n: usize, what: &str| -> Result<i64, String> {
        let field = b.get(at..at + n).ok_or_else(|| format!("not a valid RFC3339 timestamp: end of string before {what}"))?;
        if !field.iter().all(u8::is_ascii_digit) {
            let shown = String::from_utf8_lossy(&b[at..(at + n).min(b.len())]);
            return Err(format!("not a valid RFC3339 timestamp: cannot use \"{shown}\" as {what}"));
        }
        at += n;
        Ok(field.iter().fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0')))
    };
    let year = digits(4, "year")?;
    let sep = |at: usize, want: u8| -> Result<(), String> {
        match b.get(at) {
            Some(c) if *c == want => Ok(()),
            Some(_) if want == b'T' => Err("not a valid RFC3339 timestamp: missing required time introducer 'T'".to_string()),
            Some(c) => Err(format!("not a valid RFC3339 timestamp: found \"{}\" where \"{}\" is expected", *c as char, want as char)),
            None => Err(format!("not a valid RFC3339 timestamp: end of string where \"{}\" is expected", want as char)),
        }
    };
    sep(4, b'-')?;
    let digits = |from: usize, n: usize, what: &str| -> Result<i64, String> {
        let field = b.get(from..from + n).ok_or_else(|| format!("not a valid RFC3339 timestamp: end of string before {what}"))?;
        if !field.iter().all(u8::is_ascii_digit) {
            let shown = String::from_utf8_lossy(&b[from..(from + n).min(b.len())]);
            return Err(format!("not a valid RFC3339 timestamp: cannot use \"{shown}\" as {what}"));
        }
        Ok(field.iter().fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0')))
    };
    let month = digits(5, 2, "month")?;
    sep(7, b'-')?;
    let day = digits(8, 2, "day of month")?;
    sep(10, b'T')?;
    let hour = digits(11, 2, "hour")?;
    sep(13, b':')?;
    let minute = digits(14, 2, "minute")?;
    sep(16, b':')?;
    let second = digits(17, 2, "second")?;
    let mut i = 19;
    let mut nanos: u32 = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        for (k, d) in b[start..i].iter().take(9).enumerate() {
            nanos += u32::from(d - b'0') * 10u32.pow(8 - k as u32);
        }
    }
    let offset_seconds = match b.get(i) {
        Some(b'Z') => {
            i += 1;
            0
        }
        Some(sign @ (b'+' | b'-')) => {
            let h = digits(i + 1, 2, "UTC offset")?;
            sep(i + 3, b':')?;
            let m = digits(i + 4, 2, "UTC offset")?;
            if h > 23 || m > 59 {
                return Err("not a valid RFC3339 timestamp: UTC offset out of range".to_string());
            }
            let o = (h * 3600 + m * 60) as i32;
            i += 6;
            if *sign == b'-' { -o } else { o }
        }
        Some(_) => {
            let rest = String::from_utf8_lossy(&b[i..]);
            return Err(format!("not a valid RFC3339 timestamp: cannot use \"{rest}\" as UTC offset"));
        }
        None => return Err("not a valid RFC3339 timestamp: end of string before UTC offset".to_string()),
    };
    if i != b.len() {
        return Err(format!("not a valid RFC3339 timestamp: extra text: \"{}\"", String::from_utf8_lossy(&b[i..])));
    }
    let month_days =
        [31, if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let range = |what: &str| format!("not a valid RFC3339 timestamp: {what} out of range");
    if !(1..=12).contains(&month) {
        return Err(range("month"));
    }
    if day < 1 || day > month_days[(month - 1) as usize] {
        return Err(range("day"));
    }
    if hour > 23 {
        return Err(range("hour"));
    }
    if minute > 59 {
        return Err(range("minute"));
    }
    if second > 59 {
        return Err(range("second"));
    }
    let local = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    Ok(Time { unix_seconds: local - i64::from(offset_seconds), nanos, offset_seconds })
}

/// Terraform's date format: runs of one letter are verbs (`YYYY MM DD hh mm ss ZZZ ...`),
/// text in single quotes is literal (`''` is a quote), anything else is copied.
fn formatdate(spec: &str, t: &Time) -> Result<String, String> {
    let f = t.fields();
    let mut out = String::new();
    let chars: Vec<char> = spec.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            if chars.get(i + 1) == Some(&'\'') {
                out.push('\'');
                i += 2;
                continue;
            }
            let mut j = i + 1;
            loop {
                match chars.get(j) {
                    None => return Err("unterminated literal '".to_string()),
                    Some('\'') if chars.get(j + 1) == Some(&'\'') => {
                        out.push('\'');
                        j += 2;
                    }
                    Some('\'') => break,
                    Some(other) => {
                        out.push(*other);
                        j += 1;
                    }
                }
            }
            i = j + 1;
            continue;
        }
        if !c.is_ascii_alphabetic() {
            out.push(c);
            i += 1;
            continue;
        }
        let mut j = i;
        while chars.get(j) == Some(&c) {
            j += 1;
        }
        let verb: String = chars[i..j].iter().collect();
        let n = j - i;
        let invalid = |why: &str| {
            if why.is_empty() {
                format!("invalid date format verb \"{verb}\"")
            } else {
                format!("invalid date format verb \"{verb}\": {why}")
            }
        };
        match (c, n) {
            ('Y', 2) => out.push_str(&format!("{:02}", f.year % 100)),
            ('Y', 4) => out.push_str(&format!("{:04}", f.year)),
            ('Y', _) => return Err(invalid("year must either be \"YY\" or \"YYYY\"")),
            ('M', 1) => out.push_str(&f.month.to_string()),
            ('M', 2) => out.push_str(&format!("{:02}", f.month)),
            ('M', 3) => out.push_str(&MONTHS[(f.month - 1) as usize][..3]),
            ('M', 4) => out.push_str(MONTHS[(f.month - 1) as usize]),
            ('M', _) => return Err(invalid("month must be \"M\", \"MM\", \"MMM\", or \"MMMM\"")),
            ('D', 1) => out.push_str(&f.day.to_string()),
            ('D', 2) => out.push_str(&format!("{:02}", f.day)),
            ('D', _) => return Err(invalid("day of month must either be \"D\" or \"DD\"")),
            ('E', 3) => out.push_str(&WEEKDAYS[f.weekday][..3]),
            ('E', 4) => out.push_str(WEEKDAYS[f.weekday]),
            ('E', _) => return Err(invalid("day of week must either be \"EEE\" or \"EEEE\"")),
            ('h', 1) => out.push_str(&f.hour.to_string()),
            ('h', 2) => out.push_str(&format!("{:02}", f.hour)),
            ('h', _) => return Err(invalid("24-hour must either be \"h\" or \"hh\"")),
            ('H', 1 | 2) => {
                let h12 = if f.hour % 12 == 0 { 12 } else { f.hour % 12 };
                out.push_str(&if n == 1 { h12.to_string() } else { format!("{h12:02}") });
            }
            ('H', _) => return Err(invalid("12-hour must either be \"H\" or \"HH\"")),
            ('A' | 'a', 2) => {
                let pm = f.hour >= 12;
                out.push_str(match (c, pm) {
                    ('A', false) => "AM",
                    ('A', true) => "PM",
                    (_, false) => "am",
                    (_, true) => "pm",
                });
            }
            ('A' | 'a', _) => return Err(invalid(&format!("must be \"{c}{c}\""))),
            ('m', 1) => out.push_str(&f.minute.to_string()),
            ('m', 2) => out.push_str(&format!("{:02}", f.minute)),
            ('m', _) => return Err(invalid("minute must either be \"m\" or \"mm\"")),
            ('s', 1) => out.push_str(&f.second.to_string()),
            ('s', 2) => out.push_str(&format!("{:02}", f.second)),
            ('s', _) => return Err(invalid("second must either be \"s\" or \"ss\"")),
            ('Z', 1) => out.push_str(&t.offset(true, true)),
            ('Z', 3) => out.push_str(&if t.offset_seconds == 0 { "UTC".to_string() } else { t.offset(false, false) }),
            ('Z', 4) => out.push_str(&t.offset(false, false)),
            ('Z', 5) => out.push_str(&t.offset(false, true)),
            ('Z', _) => return Err(invalid("timezone must be Z, ZZZZ, or ZZZZZ")),
            _ => return Err(invalid("")),
        }
        i = j;
    }
    Ok(out)
}
