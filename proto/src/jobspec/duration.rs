//! Go's `time.ParseDuration`, which is what Nomad uses for duration strings.
//!
//! The parser is [`crate::time::go_duration_nanos`], shared with the HTTP API
//! and the agent config; not `humantime`, because the accepted syntax must be Go's: `"1h30m"`, `"1.5h"`, `"250ms"`, `"-1s"`, `"0"`, with
//! units `ns us µs μs ms s m h` and no spaces or days.

/// Parses a Go duration into nanoseconds, with Go's messages.
pub(crate) fn parse_go_duration(input: &str) -> Result<i64, String> {
    use crate::time::GoDurationError;
    crate::time::go_duration_nanos(input).map_err(|e| match e {
        GoDurationError::Invalid => format!("invalid duration \"{input}\""),
        GoDurationError::MissingUnit => format!("missing unit in duration \"{input}\""),
        GoDurationError::UnknownUnit(unit) => format!("unknown unit \"{unit}\" in duration \"{input}\""),
    })
}

#[cfg(test)]
mod tests {
    use super::parse_go_duration as parse;

    #[test]
    fn accepts_go_syntax() {
        assert_eq!(parse("30s"), Ok(30_000_000_000));
        assert_eq!(parse("1h30m"), Ok(5_400_000_000_000));
        assert_eq!(parse("250ms"), Ok(250_000_000));
        assert_eq!(parse("1.5h"), Ok(5_400_000_000_000));
        assert_eq!(parse("-1s"), Ok(-1_000_000_000));
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("10us"), Ok(10_000));
        assert_eq!(parse(".5s"), Ok(500_000_000));
    }

    #[test]
    fn rejects_what_go_rejects() {
        for bad in ["", "5", "5x", "1d", "s", "1h 30m", ".", "-", "9999999999999999999h"] {
            assert!(parse(bad).is_err(), "{bad:?} should not parse");
        }
        assert!(parse("5x").unwrap_err().contains("unknown unit \"x\""));
        assert!(parse("5").unwrap_err().contains("missing unit"));
    }

    #[test]
    fn the_edges_of_an_i64_are_exact() {
        assert_eq!(parse("9223372036854775807ns"), Ok(i64::MAX));
        assert_eq!(parse("-9223372036854775808ns"), Ok(i64::MIN));
        assert!(parse("9223372036854775808ns").is_err());
        assert_eq!(parse("2562047h47m16.854775807s"), Ok(i64::MAX));
        assert!(parse("2562047h47m16.854775808s").is_err());
        assert_eq!(parse("000000000000000000000000000001s"), Ok(1_000_000_000));
    }

    #[test]
    fn a_whole_part_near_the_top_of_u128_is_refused_not_wrapped() {
        // This once overflowed when the fraction was added (a panic in debug builds, a wrapped
        // and accepted value in release).
        let whole = u128::MAX / 3_600_000_000_000;
        assert!(parse(&format!("{whole}.9h")).is_err());
        assert!(parse(&format!("{}h", u128::MAX)).is_err());
    }
}
