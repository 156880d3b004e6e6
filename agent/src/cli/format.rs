//! Output helpers shared by the commands: aligned tables and key/value
//! blocks, relative and absolute times, short IDs, sizes, and colors that
//! are only used on a terminal.

use std::borrow::Cow;
use std::io::IsTerminal;
use std::time::{SystemTime, UNIX_EPOCH};

/// Characters of an ID shown unless `-verbose` asks for the full one.
pub const SHORT_ID: usize = 8;

/// `id` cut to `len` characters (IDs are ASCII UUIDs; other text is cut on a char boundary),
/// with unsafe characters escaped (see [`safe`]).
pub fn limit(id: &str, len: usize) -> Cow<'_, str> {
    let cut = match id.char_indices().nth(len) {
        Some((i, _)) => &id[..i],
        None => id,
    };
    safe(cut)
}

/// Text from a server, made safe to print: control characters (newlines, escape sequences,
/// C1 controls) and bidirectional overrides are written as escapes (`\n`, `\u{1b}`). Servers
/// refuse such IDs and names at admission, but an old or hostile server could still send
/// them, and printed raw they would rewrite the terminal or forge output lines.
pub fn safe(s: &str) -> Cow<'_, str> {
    nomad_proto::validate::escape_unsafe_chars(s, &[])
}

/// [`safe`] for text meant to span lines (messages, warnings): newlines and tabs stay.
pub fn safe_lines(s: &str) -> Cow<'_, str> {
    nomad_proto::validate::escape_unsafe_chars(s, &['\n', '\t'])
}

/// JSON text (already escaped by serde_json for C0 controls) with DEL, C1 controls and
/// bidirectional overrides also written as `\uXXXX` escapes, so `-json` output is as safe
/// to print as the tables and still the same JSON.
pub fn safe_json(json: &str) -> Cow<'_, str> {
    if !json.chars().any(nomad_proto::validate::is_unsafe_char) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if nomad_proto::validate::is_unsafe_char(c) && c != '\n' {
            // Outside strings the only control characters serde_json writes are newlines
            // (pretty printing); everything else here is inside a string, where \u is valid.
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A value as indented JSON, printed safe (see [`safe_json`]), for `-json` output of values the
/// command decoded and sorted itself.
pub fn json_text(v: &impl serde::Serialize) -> String {
    safe_json(&serde_json::to_string_pretty(v).unwrap_or_default()).into_owned()
}

/// The ID length for the `-verbose` setting.
pub fn id_len(verbose: bool) -> usize {
    if verbose { usize::MAX } else { SHORT_ID }
}

/// Columns separated by two spaces, each as wide as its widest cell; the
/// first row is the header. Trailing spaces are trimmed from every line.
pub fn table<R: AsRef<[String]>>(rows: &[R]) -> String {
    let rows: Vec<Vec<Cow<'_, str>>> = rows.iter().map(|r| r.as_ref().iter().map(|c| safe(c)).collect()).collect();
    let mut widths: Vec<usize> = Vec::new();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            let w = cell.chars().count();
            if i >= widths.len() {
                widths.push(w);
            } else if w > widths[i] {
                widths[i] = w;
            }
        }
    }
    let mut out = String::new();
    for cells in &rows {
        let mut line = String::new();
        for (i, cell) in cells.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < cells.len() {
                let pad = widths[i] - cell.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.pop();
    out
}

/// Builds a table from a header and rows of displayable cells.
pub fn table_with_header(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut all = Vec::with_capacity(rows.len() + 1);
    all.push(header.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    all.extend(rows);
    table(&all)
}

/// `Key = Value` lines with the `=` signs aligned; keys and values printed [`safe`].
pub fn kv(pairs: &[(&str, String)]) -> String {
    let pairs: Vec<(Cow<'_, str>, Cow<'_, str>)> = pairs.iter().map(|(k, v)| (safe(k), safe(v))).collect();
    let width = pairs.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
    pairs
        .iter()
        .map(|(k, v)| {
            let pad = width - k.chars().count();
            format!("{k}{} = {v}", " ".repeat(pad)).trim_end().to_string()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Now, in Unix nanoseconds.
pub fn now_nanos() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)).unwrap_or(0)
}

/// How long ago `then` was, seen from `now` (both Unix nanoseconds), in the
/// two largest non-zero units: `45s ago`, `1m3s ago`, `2h5m ago`, `3d4h ago`,
/// `1y2mo ago`, or `... from now` for a future time. Unset times (0) give `N/A`.
pub fn relative_time(then: i64, now: i64) -> String {
    if then == 0 {
        return "N/A".to_string();
    }
    let round = |ns: i64| (ns + 500_000_000).div_euclid(1_000_000_000);
    let (then_s, now_s) = (round(then), round(now));
    let (secs, suffix) = if now_s >= then_s { (now_s - then_s, "ago") } else { (then_s - now_s, "from now") };
    format!("{} {suffix}", duration_top_two(secs.unsigned_abs()))
}

/// Whole seconds as the two largest non-zero units (`0s` for zero).
pub fn duration_top_two(secs: u64) -> String {
    const UNITS: [(&str, u64); 6] = [("y", 365 * 86_400), ("mo", 30 * 86_400), ("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)];
    let mut rest = secs;
    let mut parts = Vec::new();
    for (name, size) in UNITS {
        let n = rest / size;
        rest %= size;
        if n > 0 {
            parts.push(format!("{n}{name}"));
        } else if !parts.is_empty() {
            // Units are consecutive: once the largest is found, the next one
            // (even when zero) ends the pair.
            break;
        }
        if parts.len() == 2 {
            break;
        }
    }
    if parts.is_empty() { "0s".to_string() } else { parts.concat() }
}

/// A duration in nanoseconds the way Go prints one: `1h2m3s`, `1.5s`, `300ms`, `0s`.
pub fn go_duration(ns: i64) -> String {
    if ns == 0 {
        return "0s".to_string();
    }
    let neg = ns < 0;
    let ns = ns.unsigned_abs();
    let body = if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{}µs", trim_fraction(ns, 1_000))
    } else if ns < 1_000_000_000 {
        format!("{}ms", trim_fraction(ns, 1_000_000))
    } else {
        let total_secs = ns / 1_000_000_000;
        let (h, m) = (total_secs / 3600, (total_secs % 3600) / 60);
        let secs = trim_fraction(ns % 60_000_000_000, 1_000_000_000);
        let mut s = String::new();
        if h > 0 {
            s.push_str(&format!("{h}h"));
        }
        if h > 0 || m > 0 {
            s.push_str(&format!("{m}m"));
        }
        s.push_str(&format!("{secs}s"));
        s
    };
    if neg { format!("-{body}") } else { body }
}

fn trim_fraction(v: u64, unit: u64) -> String {
    let whole = v / unit;
    let frac = v % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let digits = unit.ilog10() as usize;
    let f = format!("{frac:0digits$}");
    format!("{whole}.{}", f.trim_end_matches('0'))
}

/// Parses a Go-style duration (`90s`, `1h30m`, `500ms`, `-1s`). A bare `0` is zero.
pub fn parse_go_duration(s: &str) -> Result<i64, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let d = humantime::parse_duration(body).map_err(|e| format!("invalid duration {s:?}: {e}"))?;
    let ns = i64::try_from(d.as_nanos()).map_err(|_| format!("duration {s:?} is too large"))?;
    Ok(if neg { -ns } else { ns })
}

/// An absolute time in the local time zone, RFC 3339 to the second
/// (`2024-05-01T10:02:03+02:00`). Unset times (0) give `N/A`.
pub fn format_time(ns: i64) -> String {
    if ns == 0 {
        return "N/A".to_string();
    }
    let secs = ns.div_euclid(1_000_000_000);
    match local_fields(secs) {
        Some(f) => rfc3339(f),
        None => rfc3339(utc_fields(secs)),
    }
}

/// Broken-down time: year, month, day, hour, minute, second, UTC offset in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeFields {
    /// Year.
    pub year: i64,
    /// Month, 1-12.
    pub month: u32,
    /// Day, 1-31.
    pub day: u32,
    /// Hour.
    pub hour: u32,
    /// Minute.
    pub minute: u32,
    /// Second.
    pub second: u32,
    /// Offset east of UTC, seconds.
    pub offset: i64,
}

/// Formats broken-down time as RFC 3339 (`Z` for UTC).
pub fn rfc3339(f: TimeFields) -> String {
    let zone = if f.offset == 0 {
        "Z".to_string()
    } else {
        let sign = if f.offset < 0 { '-' } else { '+' };
        let o = f.offset.abs();
        format!("{sign}{:02}:{:02}", o / 3600, (o % 3600) / 60)
    };
    format!("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{zone}", f.year, f.month, f.day, f.hour, f.minute, f.second)
}

fn local_fields(secs: i64) -> Option<TimeFields> {
    // time_t is 32 bits on some targets.
    #[allow(clippy::useless_conversion)]
    let t: libc::time_t = secs.try_into().ok()?;
    // SAFETY: `tm` is plain data that localtime_r fills completely; both pointers are valid for
    // the call and localtime_r keeps neither.
    let tm = unsafe {
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&t, &mut tm).is_null() {
            return None;
        }
        tm
    };
    Some(TimeFields {
        year: i64::from(tm.tm_year) + 1900,
        month: u32::try_from(tm.tm_mon + 1).ok()?,
        day: u32::try_from(tm.tm_mday).ok()?,
        hour: u32::try_from(tm.tm_hour).ok()?,
        minute: u32::try_from(tm.tm_min).ok()?,
        second: u32::try_from(tm.tm_sec).ok()?,
        offset: tm.tm_gmtoff,
    })
}

/// UTC fields of Unix seconds (civil-from-days).
pub fn utc_fields(secs: i64) -> TimeFields {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    TimeFields {
        year,
        month: month as u32,
        day: day as u32,
        hour: (rem / 3600) as u32,
        minute: ((rem % 3600) / 60) as u32,
        second: (rem % 60) as u32,
        offset: 0,
    }
}

/// MiB as Nomad prints sizes: `300 MiB`, `7.7 GiB`.
pub fn mib(v: i64) -> String {
    if v.abs() >= 1024 {
        let g = v as f64 / 1024.0;
        let s = format!("{g:.1}");
        format!("{} GiB", s.trim_end_matches(".0"))
    } else {
        format!("{v} MiB")
    }
}

/// `<none>` for an empty string.
pub fn or_none(s: &str) -> String {
    if s.is_empty() { "<none>".to_string() } else { s.to_string() }
}

/// Terminal styling; every method returns the text unchanged when color is off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// Emit ANSI colors.
    pub color: bool,
}

impl Style {
    /// Colors on when stdout is a terminal, `NO_COLOR` is unset, `TERM` is not `dumb`
    /// and `-no-color` was not given.
    pub fn detect(no_color: bool) -> Style {
        let dumb = std::env::var("TERM").is_ok_and(|t| t == "dumb");
        Style { color: !no_color && !dumb && std::env::var_os("NO_COLOR").is_none() && std::io::stdout().is_terminal() }
    }

    /// No colors.
    pub fn plain() -> Style {
        Style { color: false }
    }

    /// `s` in the color `code`; unsafe characters in `s` escaped (newlines and tabs kept), so
    /// the only escape sequences printed are the ones this adds.
    fn wrap(&self, code: &str, s: &str) -> String {
        let s = safe_lines(s);
        if self.color { format!("\x1b[{code}m{s}\x1b[0m") } else { s.into_owned() }
    }

    /// Bold.
    pub fn bold(&self, s: &str) -> String {
        self.wrap("1", s)
    }

    /// Green.
    pub fn green(&self, s: &str) -> String {
        self.wrap("32", s)
    }

    /// Yellow.
    pub fn yellow(&self, s: &str) -> String {
        self.wrap("33", s)
    }

    /// Red.
    pub fn red(&self, s: &str) -> String {
        self.wrap("31", s)
    }

    /// A section header: a blank line, then the title in bold.
    pub fn section(&self, title: &str) -> String {
        format!("\n{}", self.bold(title))
    }
}

/// Stdout is a terminal that understands cursor movement.
pub fn stdout_is_live_terminal() -> bool {
    std::io::stdout().is_terminal() && !std::env::var("TERM").is_ok_and(|t| t == "dumb")
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1_000_000_000;

    #[test]
    fn tables_align_columns_with_two_spaces_and_no_trailing_blanks() {
        let t = table_with_header(
            &["ID", "Status", "Name"],
            vec![vec!["a1".into(), "running".into(), "web".into()], vec!["bbbbbb22".into(), "ok".into(), "".into()]],
        );
        assert_eq!(t, "ID        Status   Name\na1        running  web\nbbbbbb22  ok");
    }

    #[test]
    fn kv_aligns_the_equals_signs() {
        let out = kv(&[("ID", "web".into()), ("Submit Date", "now".into()), ("Empty", String::new())]);
        assert_eq!(out, "ID          = web\nSubmit Date = now\nEmpty       =");
    }

    #[test]
    fn relative_times_use_the_two_largest_units() {
        let now = 1_700_000_000 * S;
        assert_eq!(relative_time(now - 45 * S, now), "45s ago");
        assert_eq!(relative_time(now - 63 * S, now), "1m3s ago");
        assert_eq!(relative_time(now - 3600 * S, now), "1h ago");
        assert_eq!(relative_time(now - (2 * 3600 + 5 * 60 + 9) * S, now), "2h5m ago");
        assert_eq!(relative_time(now - (3 * 86_400 + 4 * 3600 + 1) * S, now), "3d4h ago");
        assert_eq!(relative_time(now - (86_400 + 30) * S, now), "1d ago", "the unit after the largest ends the pair");
        assert_eq!(relative_time(now - (400 * 86_400) * S, now), "1y1mo ago");
        assert_eq!(relative_time(now + 90 * S, now), "1m30s from now");
        assert_eq!(relative_time(now, now), "0s ago");
        assert_eq!(relative_time(now - 400_000_000, now), "0s ago", "rounded to the second");
        assert_eq!(relative_time(0, now), "N/A");
    }

    #[test]
    fn go_durations_print_like_go() {
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(5 * S), "5s");
        assert_eq!(go_duration(63 * S), "1m3s");
        assert_eq!(go_duration(3600 * S), "1h0m0s");
        assert_eq!(go_duration(1_500_000_000), "1.5s");
        assert_eq!(go_duration(300_000_000), "300ms");
        assert_eq!(go_duration(-2 * S), "-2s");
    }

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("1h30m").unwrap(), 5400 * S);
        assert_eq!(parse_go_duration("90s").unwrap(), 90 * S);
        assert_eq!(parse_go_duration("500ms").unwrap(), 500_000_000);
        assert_eq!(parse_go_duration("0").unwrap(), 0);
        assert_eq!(parse_go_duration("-1s").unwrap(), -S);
        assert!(parse_go_duration("soon").unwrap_err().contains("invalid duration \"soon\""));
    }

    #[test]
    fn times_format_as_rfc3339() {
        assert_eq!(rfc3339(utc_fields(0)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(utc_fields(1_714_557_723)), "2024-05-01T10:02:03Z");
        let f = TimeFields { offset: 2 * 3600, ..utc_fields(1_714_557_723) };
        assert_eq!(rfc3339(f), "2024-05-01T10:02:03+02:00");
        let f = TimeFields { offset: -(5 * 3600 + 30 * 60), ..utc_fields(1_714_557_723) };
        assert_eq!(rfc3339(f), "2024-05-01T10:02:03-05:30");
        assert_eq!(format_time(0), "N/A");
        assert!(format_time(1_714_557_723 * S).starts_with("2024-0"), "local time, whatever the zone");
    }

    #[test]
    fn ids_are_shortened_unless_verbose() {
        let id = "0af996ed-aff4-8ddb-a566-e55ebf8969c9";
        assert_eq!(limit(id, id_len(false)), "0af996ed");
        assert_eq!(limit(id, id_len(true)), id);
        assert_eq!(limit("web", 8), "web");
    }

    #[test]
    fn sizes_and_placeholders() {
        assert_eq!(mib(300), "300 MiB");
        assert_eq!(mib(7885), "7.7 GiB");
        assert_eq!(mib(8192), "8 GiB");
        assert_eq!(or_none(""), "<none>");
        assert_eq!(or_none("x"), "x");
    }

    #[test]
    fn server_text_never_prints_a_control_character_raw() {
        let evil = "web\n2024-01-01 [INFO] forged\u{1b}]0;pwned\u{7}\u{9b}2J\u{202e}";
        let printed = [
            table(&[vec!["ID".to_string()], vec![evil.to_string()]]),
            kv(&[("ID", evil.to_string()), (evil, "x".to_string())]),
            limit(evil, usize::MAX).into_owned(),
            Style { color: true }.yellow(evil),
            Style::plain().section(evil),
            safe_lines(evil).into_owned(),
        ];
        for p in &printed {
            let raw: Vec<char> = p.chars().filter(|c| nomad_proto::validate::is_unsafe_char(*c) && *c != '\n').collect();
            // The only escapes left are the ones the style itself adds.
            assert!(raw.iter().all(|c| *c == '\u{1b}') && p.matches('\u{1b}').count() == p.matches("\u{1b}[").count(), "{p:?}");
            assert!(!p.contains("\u{1b}]0;") && !p.contains('\u{9b}') && !p.contains('\u{202e}'), "{p:?}");
        }
        // A newline inside a cell or a value cannot start a line of its own.
        assert_eq!(table(&[vec![evil.to_string()]]).lines().count(), 1);
        assert_eq!(kv(&[("ID", evil.to_string())]).lines().count(), 1);
        assert!(printed[1].contains("web\\n2024-01-01"), "{}", printed[1]);
        // -json stays JSON with the same value.
        let json = serde_json::to_string_pretty(&serde_json::json!({ "ID": evil })).unwrap();
        let shown = safe_json(&json);
        assert!(!shown.chars().any(|c| nomad_proto::validate::is_unsafe_char(c) && c != '\n'), "{shown:?}");
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back["ID"], evil);
    }

    #[test]
    fn plain_style_adds_no_escapes() {
        let s = Style::plain();
        assert_eq!(s.bold("x"), "x");
        assert_eq!(s.section("Allocations"), "\nAllocations");
        let c = Style { color: true };
        assert_eq!(c.green("ok"), "\x1b[32mok\x1b[0m");
    }
}
