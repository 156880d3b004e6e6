//! The filesystem functions (go-cty-funcs' `filesystem`), only reached when
//! the caller allows filesystem access (the CLI does; the HTTP parse endpoint
//! does not, as in Nomad). Relative paths are read from the job file's
//! directory. Reads are bounded: a file must be a regular file (so a FIFO
//! cannot hang the parse) of at most [`MAX_JOBSPEC_BYTES`], checked before it
//! is read; `fileset` walks a bounded number of directories and levels and
//! returns a bounded number of matches.

use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hcl::Value;

use super::{FileAccess, bounded, strings};
use crate::jobspec::MAX_JOBSPEC_BYTES;

/// Most directory entries one `fileset` call looks at.
const MAX_FILESET_ENTRIES: usize = 100_000;
/// Most files one `fileset` call returns.
const MAX_FILESET_MATCHES: usize = 10_000;
/// Deepest directory level below the base that `fileset` descends to.
const MAX_FILESET_DEPTH: usize = 32;
/// Most patterns `{a,b}` alternatives may expand one pattern to.
const MAX_BRACE_EXPANSIONS: usize = 256;

pub(super) fn call(name: &str, args: &[Value], files: &FileAccess) -> Result<Value, String> {
    match name {
        "basename" => {
            let [p] = strings::<1>(args)?;
            Ok(Value::String(go_base(&p)))
        }
        "dirname" => {
            let [p] = strings::<1>(args)?;
            Ok(Value::String(go_dir(&p)))
        }
        "abspath" => {
            // Go's filepath.Abs: relative to the working directory (not the job file's).
            let [p] = strings::<1>(args)?;
            let joined = if p.starts_with('/') {
                p
            } else {
                let cwd = std::env::current_dir().map_err(|e| format!("cannot find the working directory: {e}"))?;
                format!("{}/{p}", cwd.to_string_lossy())
            };
            Ok(Value::String(go_clean(&joined)))
        }
        "pathexpand" => {
            let [p] = strings::<1>(args)?;
            Ok(Value::String(expand_home(&p)?))
        }
        "file" | "filebase64" => {
            let [p] = strings::<1>(args)?;
            let path = resolve(files, &p)?;
            let bytes = read_bounded(&path)?;
            if name == "filebase64" {
                return bounded(STANDARD.encode(&bytes));
            }
            let text = String::from_utf8(bytes).map_err(|_| {
                format!(
                    "contents of {p} are not valid UTF-8; use the filebase64 function to obtain the Base64 encoded contents or the other file functions (e.g. filemd5, filesha256) to obtain file hashing results instead"
                )
            })?;
            bounded(text)
        }
        "fileexists" => {
            let [p] = strings::<1>(args)?;
            let path = resolve(files, &p)?;
            match std::fs::metadata(&path) {
                Ok(m) if m.is_file() => Ok(Value::Bool(true)),
                Ok(m) => Err(format!("{} is not a regular file, but \"{}\"", path.display(), mode_string(&m))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Value::Bool(false)),
                Err(_) => Err(format!("failed to stat {}", path.display())),
            }
        }
        "fileset" => {
            let [dir, pattern] = strings::<2>(args)?;
            fileset(files, &dir, &pattern)
        }
        _ => unreachable!("{name} is not a filesystem function"),
    }
}

/// `~` and `~/...` to the home directory (go-homedir's Expand).
fn expand_home(p: &str) -> Result<String, String> {
    if !p.starts_with('~') {
        return Ok(p.to_string());
    }
    if p.len() > 1 && !p[1..].starts_with('/') {
        return Err("cannot expand user-specific home dir".to_string());
    }
    let home = std::env::var("HOME").ok().filter(|h| !h.is_empty()).ok_or("failed to expand ~: $HOME is not set")?;
    Ok(format!("{home}{}", &p[1..]))
}

/// A path as the file functions read it: `~` expanded, relative to the job file's directory, cleaned.
fn resolve(files: &FileAccess, p: &str) -> Result<PathBuf, String> {
    let expanded = expand_home(p).map_err(|e| if e.starts_with("failed") { e } else { format!("failed to expand ~: {e}") })?;
    let joined = if expanded.starts_with('/') {
        expanded
    } else {
        match &files.base_dir {
            Some(base) => format!("{}/{expanded}", base.to_string_lossy()),
            None => expanded,
        }
    };
    Ok(PathBuf::from(go_clean(&joined)))
}

/// Reads a regular file of at most [`MAX_JOBSPEC_BYTES`], checking both before and while reading.
fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    let not_found = || format!("no file exists at {}", path.display());
    let meta = std::fs::metadata(path)
        .map_err(|e| if e.kind() == std::io::ErrorKind::NotFound { not_found() } else { format!("failed to read {}", path.display()) })?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file, but \"{}\"", path.display(), mode_string(&meta)));
    }
    if meta.len() > MAX_JOBSPEC_BYTES as u64 {
        return Err(format!("{} is {} bytes; a file read by a job file may be at most {MAX_JOBSPEC_BYTES}", path.display(), meta.len()));
    }
    let file = std::fs::File::open(path).map_err(|_| format!("failed to read {}", path.display()))?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow between the check and the read: never take more than the limit.
    file.take(MAX_JOBSPEC_BYTES as u64 + 1).read_to_end(&mut bytes).map_err(|_| format!("failed to read {}", path.display()))?;
    if bytes.len() > MAX_JOBSPEC_BYTES {
        return Err(format!("{} is more than {MAX_JOBSPEC_BYTES} bytes; a file read by a job file may be at most that", path.display()));
    }
    Ok(bytes)
}

/// Go's `FileMode.String()` of what a path is (`drwxr-xr-x`, `prw-r--r--`, ...).
fn mode_string(m: &std::fs::Metadata) -> String {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let t = m.file_type();
    let kind = if t.is_dir() {
        "d"
    } else if t.is_fifo() {
        "p"
    } else if t.is_socket() {
        "S"
    } else if t.is_char_device() {
        "Dc"
    } else if t.is_block_device() {
        "D"
    } else if t.is_symlink() {
        "L"
    } else {
        ""
    };
    let mode = m.permissions().mode();
    let rwx: String = (0..9).map(|i| if mode & (1 << (8 - i)) != 0 { b"rwxrwxrwx"[i] as char } else { '-' }).collect();
    format!("{}{rwx}", if kind.is_empty() { "-" } else { kind })
}

/// Go's `filepath.Clean`, lexically: no `.`, no `x/..`, no doubled or trailing slashes.
pub(crate) fn go_clean(p: &str) -> String {
    if p.is_empty() {
        return ".".to_string();
    }
    let rooted = p.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in p.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            other => parts.push(other),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// Go's `filepath.Base`.
fn go_base(p: &str) -> String {
    if p.is_empty() {
        return ".".to_string();
    }
    let trimmed = p.trim_end_matches('/');
    if trimmed.is_empty() {
        return "/".to_string();
    }
    trimmed.rsplit('/').next().unwrap_or(trimmed).to_string()
}

/// Go's `filepath.Dir`.
fn go_dir(p: &str) -> String {
    let dir = match p.rfind('/') {
        Some(i) => &p[..=i],
        None => "",
    };
    go_clean(dir)
}

/// Files under `dir` (relative to the job file's directory) matching `pattern`, with `*`, `?`,
/// `[...]`, `{a,b}` and `**` (any number of directories), as paths relative to `dir`, sorted.
fn fileset(files: &FileAccess, dir: &str, pattern: &str) -> Result<Value, String> {
    let base = if dir.starts_with('/') {
        PathBuf::from(go_clean(dir))
    } else {
        match &files.base_dir {
            Some(b) => PathBuf::from(go_clean(&format!("{}/{dir}", b.to_string_lossy()))),
            None => PathBuf::from(go_clean(dir)),
        }
    };
    let mut patterns = Vec::new();
    expand_braces(pattern, &mut patterns)?;
    let mut walk = Walk { entries: 0, matches: Vec::new() };
    for p in &patterns {
        let cleaned = go_clean(p);
        if cleaned.starts_with("../") || cleaned == ".." || cleaned.starts_with('/') {
            // Joined onto the base, a pattern leaving it matches nothing relative to it.
            continue;
        }
        let segments: Vec<&str> = if cleaned == "." { Vec::new() } else { cleaned.split('/').collect() };
        for s in &segments {
            check_pattern(s).map_err(|e| format!("failed to glob pattern ({}): {e}", base.join(p).display()))?;
        }
        walk.descend(&base, "", &segments, 0)?;
    }
    walk.matches.sort();
    walk.matches.dedup();
    Ok(Value::Array(walk.matches.into_iter().map(Value::String).collect()))
}

struct Walk {
    entries: usize,
    matches: Vec<String>,
}

impl Walk {
    fn descend(&mut self, dir: &Path, rel: &str, segments: &[&str], depth: usize) -> Result<(), String> {
        let Some((first, rest)) = segments.split_first() else {
            // The pattern is used up: `dir` itself matched; only regular files count.
            if !rel.is_empty() && std::fs::metadata(dir).is_ok_and(|m| m.is_file()) {
                if self.matches.len() >= MAX_FILESET_MATCHES {
                    return Err(format!("more than {MAX_FILESET_MATCHES} files match"));
                }
                self.matches.push(rel.to_string());
            }
            return Ok(());
        };
        if depth > MAX_FILESET_DEPTH {
            return Err(format!("the pattern reaches more than {MAX_FILESET_DEPTH} directories deep"));
        }
        if *first == "**" {
            // Zero directories...
            self.descend(dir, rel, rest, depth)?;
        }
        let Ok(entries) = std::fs::read_dir(dir) else { return Ok(()) };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            self.entries += 1;
            if self.entries > MAX_FILESET_ENTRIES {
                return Err(format!("the pattern visits more than {MAX_FILESET_ENTRIES} directory entries"));
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let child_rel = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
            let path = entry.path();
            if *first == "**" {
                // ...or one more, staying on `**` (a file ends there as the zero case of its own
                // call); symbolic links to directories are not followed, so links cannot loop.
                let follow = entry
                    .file_type()
                    .is_ok_and(|t| t.is_dir() || t.is_file() || (t.is_symlink() && std::fs::metadata(&path).is_ok_and(|m| m.is_file())));
                if follow {
                    self.descend(&path, &child_rel, segments, depth + 1)?;
                }
            } else if glob_match(first, &name) {
                self.descend(&path, &child_rel, rest, depth + 1)?;
            }
        }
        Ok(())
    }
}

/// `{a,b}` alternatives as separate patterns (nested braces work; a lone brace is literal).
fn expand_braces(pattern: &str, out: &mut Vec<String>) -> Result<(), String> {
    let Some(open) = pattern.find('{') else {
        out.push(pattern.to_string());
        return Ok(());
    };
    let mut depth = 0;
    let mut close = None;
    let mut commas = Vec::new();
    for (i, c) in pattern[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = Some(open + i);
                    break;
                }
            }
            ',' if depth == 1 => commas.push(open + i),
            _ => {}
        }
    }
    let Some(close) = close else {
        return Err("syntax error in pattern: unclosed {".to_string());
    };
    let mut starts = vec![open + 1];
    starts.extend(commas.iter().map(|c| c + 1));
    let mut ends = commas.clone();
    ends.push(close);
    for (s, e) in starts.into_iter().zip(ends) {
        let candidate = format!("{}{}{}", &pattern[..open], &pattern[s..e], &pattern[close + 1..]);
        expand_braces(&candidate, out)?;
        if out.len() > MAX_BRACE_EXPANSIONS {
            return Err(format!("the pattern expands to more than {MAX_BRACE_EXPANSIONS} alternatives"));
        }
    }
    Ok(())
}

/// Refuses a malformed segment (an unclosed `[` or a trailing `\`), as Go's matcher does.
fn check_pattern(segment: &str) -> Result<(), String> {
    let chars: Vec<char> = segment.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' if i + 1 == chars.len() => return Err("syntax error in pattern".to_string()),
            '\\' => i += 1,
            '[' => {
                let Some(end) = chars[i + 1..].iter().position(|c| *c == ']') else {
                    return Err("syntax error in pattern".to_string());
                };
                i += end + 1;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// One path segment against one pattern segment: `*`, `?`, `[abc]`, `[a-z]`, `[^x]`/`[!x]`, `\x`.
/// Memoized on (pattern position, name position), so many `*` cannot make it exponential.
fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let mut memo = vec![None; (p.len() + 1) * (n.len() + 1)];
    matches_at(&p, &n, 0, 0, &mut memo)
}

fn matches_at(p: &[char], n: &[char], pi: usize, ni: usize, memo: &mut [Option<bool>]) -> bool {
    let slot = pi * (n.len() + 1) + ni;
    if let Some(known) = memo[slot] {
        return known;
    }
    let result = match p.get(pi) {
        None => ni == n.len(),
        Some('*') => (ni..=n.len()).any(|skip| matches_at(p, n, pi + 1, skip, memo)),
        Some('?') => ni < n.len() && matches_at(p, n, pi + 1, ni + 1, memo),
        Some('[') => match (p[pi + 1..].iter().position(|c| *c == ']'), n.get(ni)) {
            (Some(end), Some(&c)) => {
                let class = &p[pi + 1..pi + 1 + end];
                let (negated, class) = match class.first() {
                    Some('^') | Some('!') => (true, &class[1..]),
                    _ => (false, class),
                };
                let mut hit = false;
                let mut i = 0;
                while i < class.len() {
                    if i + 2 < class.len() && class[i + 1] == '-' {
                        hit |= class[i] <= c && c <= class[i + 2];
                        i += 3;
                    } else {
                        hit |= class[i] == c;
                        i += 1;
                    }
                }
                hit != negated && matches_at(p, n, pi + end + 2, ni + 1, memo)
            }
            _ => false,
        },
        Some('\\') if pi + 1 < p.len() => n.get(ni) == Some(&p[pi + 1]) && matches_at(p, n, pi + 2, ni + 1, memo),
        Some(c) => n.get(ni) == Some(c) && matches_at(p, n, pi + 1, ni + 1, memo),
    };
    memo[slot] = Some(result);
    result
}
