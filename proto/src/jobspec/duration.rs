//! Go's `time.ParseDuration`, which is what Nomad uses for duration strings.
//!
//! Written here rather than taken from `humantime` because the accepted
//! syntax must be Go's: `"1h30m"`, `"1.5h"`, `"250ms"`, `"-1s"`, `"0"`, with
//! units `ns us µs μs ms s m h` and no spaces or days.

/// Parses a Go duration into nanoseconds.
pub(crate) fn parse_go_duration(input: &str) -> Result<i64, String> {
    let invalid = || format!("invalid duration \"{input}\"");
    let (negative, mut rest) = match input.as_bytes().first() {
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        _ => (false, input),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
        let (int_part, after) = rest.split_at(int_len);
        let (frac_part, after) = match after.strip_prefix('.') {
            Some(f) => {
                let frac_len = f.bytes().take_while(u8::is_ascii_digit).count();
                f.split_at(frac_len)
            }
            None => ("", after),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("missing unit in duration \"{input}\"")),
            other => return Err(format!("unknown unit \"{other}\" in duration \"{input}\"")),
        };
        let whole: u128 = if int_part.is_empty() { 0 } else { int_part.parse().map_err(|_| invalid())? };
        let mut value = whole.checked_mul(scale).ok_or_else(invalid)?;
        // Fractions keep at most the digits that still matter at nanosecond scale.
        let mut frac_scale = scale;
        for d in frac_part.bytes().take(24) {
            frac_scale /= 10;
            value += u128::from(d - b'0') * frac_scale;
        }
        total = total.checked_add(value).ok_or_else(invalid)?;
        if total > i64::MAX as u128 {
            return Err(invalid());
        }
        rest = after;
    }
    let total = total as i64;
    Ok(if negative { -total } else { total })
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
    }
}
