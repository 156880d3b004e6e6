//! Wall-clock instants in Nomad's JSON shape.
//!
//! Go encodes `time.Time` as an RFC 3339 string and its zero value as
//! `"0001-01-01T00:00:00Z"`. [`Timestamp`] keeps nanoseconds since the Unix
//! epoch; `0` stands for Go's zero time (unset), which is how every Nomad
//! client reads an absent time.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Nanoseconds since the Unix epoch; `0` means "unset" (Go's zero time).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub i64);

const GO_ZERO_TIME: &str = "0001-01-01T00:00:00Z";

impl Timestamp {
    /// The unset time.
    pub const ZERO: Timestamp = Timestamp(0);

    /// The current wall-clock time.
    pub fn now() -> Timestamp {
        Timestamp::from_system(SystemTime::now())
    }

    /// Converts a `SystemTime`; times before the epoch clamp to it.
    pub fn from_system(t: SystemTime) -> Timestamp {
        match t.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            Err(_) => Timestamp(0),
        }
    }

    /// Builds a timestamp from Unix nanoseconds.
    pub fn from_unix_nanos(ns: i64) -> Timestamp {
        Timestamp(ns)
    }

    /// Unix nanoseconds (0 when unset).
    pub fn unix_nanos(self) -> i64 {
        self.0
    }

    /// Whole Unix seconds (0 when unset).
    pub fn unix_secs(self) -> i64 {
        self.0.div_euclid(1_000_000_000)
    }

    /// True when this is Go's zero time.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// This instant moved forward by `d` (saturating).
    pub fn plus(self, d: Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)))
    }

    /// This instant moved by `ns` nanoseconds (saturating).
    pub fn add_nanos(self, ns: i64) -> Timestamp {
        Timestamp(self.0.saturating_add(ns))
    }

    /// Formats as RFC 3339 with nanoseconds, UTC, trailing zeros trimmed as Go does.
    pub fn to_rfc3339(self) -> String {
        if self.0 == 0 {
            return GO_ZERO_TIME.to_string();
        }
        let secs = self.0.div_euclid(1_000_000_000);
        let nanos = self.0.rem_euclid(1_000_000_000);
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400);
        let (y, m, d) = civil_from_days(days);
        let mut s = format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, (rem % 3600) / 60, rem % 60);
        if nanos != 0 {
            let frac = format!("{nanos:09}");
            s.push('.');
            s.push_str(frac.trim_end_matches('0'));
        }
        s.push('Z');
        s
    }

    /// Parses RFC 3339 (`2024-01-02T03:04:05.123Z`, `...+01:00`). Go's zero time parses to unset.
    pub fn parse_rfc3339(s: &str) -> Result<Timestamp, TimeParseError> {
        let err = || TimeParseError(s.to_string());
        let b = s.as_bytes();
        if b.len() < 20
            || b[4] != b'-'
            || b[7] != b'-'
            || !(b[10] == b'T' || b[10] == b't' || b[10] == b' ')
            || b[13] != b':'
            || b[16] != b':'
        {
            return Err(err());
        }
        let num =
            |r: std::ops::Range<usize>| -> Result<i64, TimeParseError> { s.get(r).and_then(|p| p.parse::<i64>().ok()).ok_or_else(err) };
        let (y, mo, d, h, mi, se) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
        if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
            return Err(err());
        }
        let mut i = 19;
        let mut nanos: i64 = 0;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let start = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            let digits = &s[start..i];
            if digits.is_empty() {
                return Err(err());
            }
            let mut padded = digits.chars().take(9).collect::<String>();
            while padded.len() < 9 {
                padded.push('0');
            }
            nanos = padded.parse().map_err(|_| err())?;
        }
        let offset_secs = match &s[i..] {
            "Z" | "z" => 0,
            off if off.len() == 6 && (off.starts_with('+') || off.starts_with('-')) && &off[3..4] == ":" => {
                let oh: i64 = off[1..3].parse().map_err(|_| err())?;
                let om: i64 = off[4..6].parse().map_err(|_| err())?;
                let v = oh * 3600 + om * 60;
                if off.starts_with('-') { -v } else { v }
            }
            _ => return Err(err()),
        };
        if y == 1 && mo == 1 && d == 1 && h == 0 && mi == 0 && se == 0 && nanos == 0 {
            return Ok(Timestamp::ZERO);
        }
        let days = days_from_civil(y, mo, d);
        let secs = days * 86_400 + h * 3600 + mi * 60 + se - offset_secs;
        secs.checked_mul(1_000_000_000).and_then(|v| v.checked_add(nanos)).map(Timestamp).ok_or_else(err)
    }
}

/// A time string that is not RFC 3339.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid time {0:?}: expected RFC 3339 such as 2024-01-02T15:04:05Z")]
pub struct TimeParseError(pub String);

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        match v {
            serde_json::Value::Null => Ok(Timestamp::ZERO),
            serde_json::Value::String(s) => Timestamp::parse_rfc3339(&s).map_err(serde::de::Error::custom),
            other => Err(serde::de::Error::custom(format!("invalid time {other}: expected an RFC 3339 string"))),
        }
    }
}

// Howard Hinnant's civil-calendar algorithms (public domain), proleptic Gregorian.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses a Go duration string (`"300ms"`, `"1.5h"`, `"2h45m"`, `"-1s"`) into nanoseconds.
pub fn parse_go_duration(s: &str) -> Result<i64, DurationParseError> {
    let err = || DurationParseError(s.to_string());
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(err)?;
        if num_end == 0 {
            return Err(err());
        }
        let value: f64 = rest[..num_end].parse().map_err(|_| err())?;
        rest = &rest[num_end..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(err()),
        };
        rest = &rest[unit_end..];
        total += value * scale;
    }
    if total > i64::MAX as f64 {
        return Err(err());
    }
    let ns = total.round() as i64;
    Ok(if neg { -ns } else { ns })
}

/// A duration string Go's `time.ParseDuration` would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: expected a number with a unit such as 30s, 500ms, 1h30m")]
pub struct DurationParseError(pub String);

/// Current time as Unix nanoseconds.
pub fn now_unix_nanos() -> i64 {
    Timestamp::now().0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_time_round_trips_as_go_zero() {
        assert_eq!(Timestamp::ZERO.to_rfc3339(), "0001-01-01T00:00:00Z");
        assert_eq!(Timestamp::parse_rfc3339("0001-01-01T00:00:00Z").unwrap(), Timestamp::ZERO);
        let v: Timestamp = serde_json::from_str("null").unwrap();
        assert!(v.is_zero());
    }

    #[test]
    fn formats_and_parses_known_instants() {
        let t = Timestamp::parse_rfc3339("2023-03-15T10:20:30.5Z").unwrap();
        assert_eq!(t.unix_secs(), 1_678_875_630);
        assert_eq!(t.to_rfc3339(), "2023-03-15T10:20:30.5Z");
        let off = Timestamp::parse_rfc3339("2023-03-15T11:20:30.5+01:00").unwrap();
        assert_eq!(off, t);
    }

    #[test]
    fn rejects_garbage_with_a_clear_message() {
        for bad in ["", "yesterday", "2023-13-01T00:00:00Z", "2023-01-01T00:00:00", "2023-01-01T00:00:00.Z"] {
            let e = Timestamp::parse_rfc3339(bad).unwrap_err();
            assert!(e.to_string().contains("RFC 3339"), "{e}");
        }
        assert!(serde_json::from_str::<Timestamp>("12").is_err());
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("300ms").unwrap(), 300_000_000);
        assert_eq!(parse_go_duration("1h30m").unwrap(), 5_400_000_000_000);
        assert_eq!(parse_go_duration("1.5s").unwrap(), 1_500_000_000);
        assert_eq!(parse_go_duration("0").unwrap(), 0);
        assert_eq!(parse_go_duration("-2s").unwrap(), -2_000_000_000);
        for bad in ["", "5", "s", "5x", "1h-3m", "abc"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn rfc3339_round_trips(ns in 1i64..4_000_000_000_000_000_000i64) {
            let t = Timestamp(ns);
            proptest::prop_assert_eq!(Timestamp::parse_rfc3339(&t.to_rfc3339()).unwrap(), t);
        }
    }
}
