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
    ///
    /// The text comes from RPC and HTTP bodies, so it is read byte by byte: every field must
    /// be ASCII digits where digits belong, and nothing is sliced at an index that might fall
    /// inside a multi-byte character.
    pub fn parse_rfc3339(s: &str) -> Result<Timestamp, TimeParseError> {
        let err = || TimeParseError(s.to_string());
        let b = s.as_bytes();
        // Digits b[at..at + n] as a number; anything else (a sign, a space, a non-ASCII byte) is an error.
        let digits = |at: usize, n: usize| -> Result<i64, TimeParseError> {
            let field = b.get(at..at + n).ok_or_else(err)?;
            if !field.iter().all(u8::is_ascii_digit) {
                return Err(err());
            }
            Ok(field.iter().fold(0i64, |acc, d| acc * 10 + i64::from(d - b'0')))
        };
        if b.len() < 20
            || b[4] != b'-'
            || b[7] != b'-'
            || !(b[10] == b'T' || b[10] == b't' || b[10] == b' ')
            || b[13] != b':'
            || b[16] != b':'
        {
            return Err(err());
        }
        let (y, mo, d, h, mi, se) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?, digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
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
            if i == start {
                return Err(err());
            }
            // Digits past nanoseconds are dropped, as Go does.
            for (k, d) in b[start..i].iter().take(9).enumerate() {
                nanos += i64::from(d - b'0') * 10i64.pow(8 - k as u32);
            }
        }
        let offset_secs = match &b[i..] {
            b"Z" | b"z" => 0,
            [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
                let (oh, om) = (digits(i + 1, 2)?, digits(i + 4, 2)?);
                if oh > 23 || om > 59 {
                    return Err(err());
                }
                let v = oh * 3600 + om * 60;
                if *sign == b'-' { -v } else { v }
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
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub(crate) fn civil_from_days(z: i64) -> (i64, i64, i64) {
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
    go_duration_nanos(s).map_err(|_| DurationParseError(s.to_string()))
}

/// Why [`go_duration_nanos`] refused a string, with Go's three cases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GoDurationError {
    /// Not a duration at all, or out of range.
    Invalid,
    /// A number without a unit.
    MissingUnit,
    /// A unit Go does not know.
    UnknownUnit(String),
}

/// Go's `time.ParseDuration`: `ns us µs μs ms s m h`, fractions, a sign, and `0` alone without a
/// unit. Computed in integers, as Go does, so `"9223372036854775807ns"` is exact and anything
/// beyond an `i64` of nanoseconds is refused rather than wrapped.
pub(crate) fn go_duration_nanos(input: &str) -> Result<i64, GoDurationError> {
    use GoDurationError::*;
    let (negative, mut rest) = match input.as_bytes().first() {
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        _ => (false, input),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(Invalid);
    }
    // One past i64::MAX is allowed while summing, for "-9223372036854775808ns".
    let limit = i64::MAX as u128 + 1;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(f) => f.split_at(f.bytes().take_while(u8::is_ascii_digit).count()),
            None => ("", after),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(Invalid);
        }
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(MissingUnit),
            other => return Err(UnknownUnit(other.to_string())),
        };
        // Leading zeros are skipped so a long run of them is not an overflow.
        let significant = int_part.trim_start_matches('0');
        if significant.len() > 19 {
            return Err(Invalid);
        }
        let whole: u128 = if significant.is_empty() { 0 } else { significant.parse().map_err(|_| Invalid)? };
        let mut value = whole.checked_mul(scale).filter(|v| *v <= limit).ok_or(Invalid)?;
        // Fractions keep the digits that still matter at nanosecond scale; each adds less than `scale`.
        let mut frac_scale = scale;
        for d in frac_part.bytes().take(24) {
            frac_scale /= 10;
            value += u128::from(d - b'0') * frac_scale;
        }
        total += value;
        if total > limit {
            return Err(Invalid);
        }
        rest = after;
    }
    match (negative, total) {
        (true, t) => Ok((t as i128).wrapping_neg() as i64),
        (false, t) if t < limit => Ok(t as i64),
        _ => Err(Invalid),
    }
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

    #[test]
    fn non_ascii_and_signed_fields_are_refused_not_sliced() {
        // "+0é00" is six bytes; slicing it at byte 3 (inside "é") panicked.
        for bad in [
            "2023-01-01T00:00:00+0\u{e9}00",
            "2023-01-01T00:00:00+\u{e9}:00",
            "2023-01-01T00:00:00.5+0\u{e9}00",
            "2023-01-01T00:00:0\u{e9}Z",
            "2023-01-01T00:00:00\u{e9}",
            "\u{e9}023-01-01T00:00:00Z",
            "2023-+1-01T00:00:00Z",
            "+023-01-01T00:00:00Z",
            "2023-01-01T00:00:00+01:+0",
            "2023-01-01T00:00:00+99:00",
            "2023-01-01T00:00:00.\u{e9}Z",
        ] {
            let e = Timestamp::parse_rfc3339(bad).unwrap_err();
            assert!(e.to_string().contains("RFC 3339"), "{bad:?}: {e}");
        }
        // The same string inside a node registration, as a gRPC body carries it.
        let body = r#"{"Node":{"ID":"n","Events":[{"Message":"m","Timestamp":"2023-01-01T00:00:00+0\u00e900"}]}}"#;
        let e = serde_json::from_str::<crate::rpc::NodeRegisterRequest>(body).unwrap_err();
        assert!(e.to_string().contains("invalid time"), "{e}");
        assert_eq!(Timestamp::parse_rfc3339("2023-03-15T10:20:30.123456789999Z").unwrap().0 % 1_000_000_000, 123_456_789);
        assert_eq!(Timestamp::parse_rfc3339("2023-03-15T10:20:30-01:30").unwrap().unix_secs(), 1_678_875_630 + 5400);
    }

    #[test]
    fn durations_beyond_an_i64_are_refused() {
        assert_eq!(parse_go_duration("9223372036854775807ns").unwrap(), i64::MAX, "exact, not rounded through f64");
        for bad in ["9223372036854775808ns", "2562048h", "99999999999999999999999999999999999999999h", "1.5.5s", "\u{e9}s", "1\u{e9}"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 2_000, ..Default::default() })]

        #[test]
        fn rfc3339_never_panics(s in "\\PC{0,40}") {
            let _ = Timestamp::parse_rfc3339(&s);
        }

        #[test]
        fn rfc3339_shaped_text_never_panics(s in "[0-9+-]{4}-[0-9\u{e9}]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\\.[0-9\u{e9}]{0,12})?(Z|z|[+-][0-9\u{e9}:]{1,6}|\\PC{0,3})") {
            let _ = Timestamp::parse_rfc3339(&s);
        }

        #[test]
        fn durations_never_panic(s in "[-+]?([0-9.]{0,30}(ns|us|\u{b5}s|\u{3bc}s|ms|s|m|h|\\PC{0,2})){0,4}") {
            let _ = parse_go_duration(&s);
        }

        #[test]
        fn duration_parts_add_up(h in 0i64..2_000_000, m in 0i64..60, ms in 0i64..60_000) {
            let ns = parse_go_duration(&format!("{h}h{m}m{ms}ms")).unwrap();
            proptest::prop_assert_eq!(ns, h * 3_600_000_000_000 + m * 60_000_000_000 + ms * 1_000_000);
        }

        #[test]
        fn rfc3339_round_trips(ns in 1i64..4_000_000_000_000_000_000i64) {
            let t = Timestamp(ns);
            proptest::prop_assert_eq!(Timestamp::parse_rfc3339(&t.to_rfc3339()).unwrap(), t);
        }
    }
}
