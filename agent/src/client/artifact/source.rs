//! What to fetch and where: an interpolated artifact turned into the request URL, its archive
//! type, its checksum and its target beneath the alloc dir, by go-getter's `Client.Get` rules as
//! Nomad configures it (http getter only; no X-Terraform-Get, no HEAD probe, no `//subdir`).

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use url::Url;

use super::checksum::Checksum;
use super::unpack::Archive;

/// `mode` of the artifact block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A file (into the destination dir, under the URL's file name), or an archive unpacked
    /// into the destination dir.
    Any,
    /// One file at the destination (an archive must hold exactly one).
    File,
    /// A directory: over http, only an archive can be one.
    Dir,
}

impl Mode {
    /// From the job's `GetterMode` (empty is `any`, as Nomad's validation makes it).
    pub fn parse(s: &str) -> Result<Mode, String> {
        match s {
            "" | "any" => Ok(Mode::Any),
            "file" => Ok(Mode::File),
            "dir" => Ok(Mode::Dir),
            other => Err(format!("invalid artifact mode {other:?}; must be one of: any, file, dir")),
        }
    }
}

/// Where the fetched bytes end up, relative to the alloc dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One file at this path.
    File(PathBuf),
    /// A directory the archive is unpacked into.
    Dir(PathBuf),
}

/// One download, decided.
#[derive(Debug)]
pub struct Plan {
    /// What is asked of the server (options appended, `archive`/`checksum` taken out).
    pub url: Url,
    /// The archive to unpack, if any.
    pub archive: Option<Archive>,
    /// What the downloaded file must hash to.
    pub checksum: Option<Checksum>,
    /// Where it goes.
    pub target: Target,
}

/// Decides a download: `source`, `options` and `destination` are already interpolated;
/// `destination` is relative to the alloc dir ([`destination_beneath_alloc`]).
pub fn plan(source: &str, options: &BTreeMap<String, String>, mode: Mode, destination: &Path) -> Result<Plan, String> {
    let Some(unforced) = nomad_proto::job::artifact_unforced_source(source) else {
        let getter = source.split_once("::").map_or(source, |(g, _)| g);
        return Err(format!("download not supported for scheme '{getter}': nomad-rs fetches only http and https artifacts"));
    };
    if let Some((_, rest)) = unforced.split_once("://")
        && rest.split(['?', '#']).next().unwrap_or_default().contains("//")
    {
        return Err("a //subdir in the source is not supported by nomad-rs: fetch an archive of that directory instead".into());
    }
    let mut url = Url::parse(unforced).map_err(|e| format!("failed to parse source URL {source:?}: {e}"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(format!("download not supported for scheme '{}': nomad-rs fetches only http and https artifacts", url.scheme()));
    }

    // Nomad sets each option on the source's query; go-getter then takes out what it consumes.
    let mut query: Vec<(String, String)> = url.query_pairs().map(|(k, v)| (k.into_owned(), v.into_owned())).collect();
    for (k, v) in options {
        query.retain(|(qk, _)| qk != k);
        query.push((k.clone(), v.clone()));
    }
    let take = |query: &mut Vec<(String, String)>, key: &str| {
        let value = query.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
        query.retain(|(k, _)| k != key);
        value
    };
    let mut changed = !options.is_empty();
    let archive_opt = take(&mut query, "archive");
    let checksum_opt = take(&mut query, "checksum");
    changed |= archive_opt.is_some() || checksum_opt.is_some();

    let path = percent_decode(url.path());
    let archive = match archive_opt.as_deref() {
        None | Some("") => Archive::by_suffix(&path),
        // Go's strconv.ParseBool false values turn unpacking off.
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => None,
        Some(kind) => Some(
            Archive::named(kind)
                .ok_or_else(|| format!("unknown archive type {kind:?} in options: one of {}, or false", Archive::names().join(", ")))?,
        ),
    };
    let checksum = match checksum_opt.as_deref() {
        None | Some("") => None,
        Some(c) => Some(Checksum::parse(c).map_err(|e| format!("invalid checksum: {e}"))?),
    };

    let target = match (archive, mode) {
        (Some(_), Mode::File) => Target::File(destination.to_path_buf()),
        (Some(_), _) => Target::Dir(destination.to_path_buf()),
        (None, Mode::File) => Target::File(destination.to_path_buf()),
        (None, Mode::Dir) => {
            return Err(
                "mode \"dir\" over http needs an archive to unpack: point the source at one (or set options { archive = \"<type>\" })"
                    .into(),
            );
        }
        (None, Mode::Any) => {
            if path.ends_with('/') {
                return Err(
                    "the source URL names a directory (it ends in /), which http cannot list: point it at a file or an archive".into()
                );
            }
            let name = match take(&mut query, "filename") {
                Some(f) if !f.is_empty() => {
                    changed = true;
                    f
                }
                _ => path.rsplit('/').next().unwrap_or_default().to_string(),
            };
            if name.split(['/', '\\']).any(|c| c == "..") {
                return Err("filename query parameter contain path traversal".into());
            }
            let name = name.trim_start_matches('/');
            if name.is_empty() || name == "." {
                return Err(
                    "the source URL has no file name to save it under: add options { filename = \"...\" } or use mode = \"file\"".into()
                );
            }
            Target::File(destination.join(name))
        }
    };
    if changed {
        // Go's `url.Values.Encode`: sorted by key.
        query.sort_by(|a, b| a.0.cmp(&b.0));
        if query.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(query.iter());
        }
    }
    Ok(Plan { url, archive, checksum, target })
}

/// `%XX` sequences decoded (invalid ones kept), as Go's `url.URL.Path` holds the path.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = ((b[i + 1] as char).to_digit(16), (b[i + 2] as char).to_digit(16))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Nomad's `TaskEnv.ClientPath` for an artifact destination: relative paths (and absolute
/// ones outside both) are taken under the task dir; the cleaned result must stay in the task
/// dir or the shared `alloc/` dir. Returns it relative to the alloc dir.
pub fn destination_beneath_alloc(dest: &str, alloc_dir: &Path, task: &str) -> Result<PathBuf, String> {
    let task_dir = clean(&alloc_dir.join(task));
    let shared = clean(&alloc_dir.join("alloc"));
    let within = |p: &Path| p.starts_with(&task_dir) || p.starts_with(&shared);
    let given = Path::new(dest);
    let path =
        if given.is_absolute() && within(&clean(given)) { clean(given) } else { clean(&task_dir.join(dest.trim_start_matches('/'))) };
    if !within(&path) {
        return Err("artifact destination path escapes alloc directory".into());
    }
    path.strip_prefix(clean(alloc_dir)).map(Path::to_path_buf).map_err(|_| "artifact destination path escapes alloc directory".into())
}

/// A path with `.` and `..` resolved lexically (`..` never climbs above the root).
fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::RootDir => out.push("/"),
            Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_longest_suffix_picks_the_archive_and_options_can_force_or_refuse_it() {
        let dest = Path::new("t/local");
        let p = |src: &str, o: &[(&str, &str)]| plan(src, &opts(o), Mode::Any, dest).unwrap();
        assert_eq!(p("https://x/a.tar.gz", &[]).archive, Some(Archive::TarGz));
        assert_eq!(p("https://x/a.tgz", &[]).archive, Some(Archive::TarGz));
        assert_eq!(p("https://x/a.gz", &[]).archive, Some(Archive::Gz));
        assert_eq!(p("https://x/a.tar.zst", &[]).archive, Some(Archive::TarZst));
        assert_eq!(p("https://x/a.tar.xz?v=1", &[]).archive, Some(Archive::TarXz));
        assert_eq!(p("https://x/a.tbz2", &[]).archive, Some(Archive::TarBz2));
        assert_eq!(p("https://x/a.zip", &[]).archive, Some(Archive::Zip));
        assert_eq!(p("https://x/a.txt", &[]).archive, None);
        assert_eq!(p("https://x/tgz", &[]).archive, None, "a suffix needs its dot");
        let off = p("https://x/a.zip", &[("archive", "false")]);
        assert_eq!((off.archive, off.target), (None, Target::File(dest.join("a.zip"))));
        let forced = p("https://x/download?id=3", &[("archive", "tar.gz")]);
        assert_eq!((forced.archive, forced.target), (Some(Archive::TarGz), Target::Dir(dest.into())));
        assert_eq!(forced.url.as_str(), "https://x/download?id=3", "archive is the getter's, not the server's");
        let e = plan("https://x/a", &opts(&[("archive", "rar")]), Mode::Any, dest).unwrap_err();
        assert!(e.contains("unknown archive type \"rar\""), "{e}");
    }

    #[test]
    fn options_go_into_the_query_except_what_the_getter_consumes() {
        let dest = Path::new("t/local");
        let sum = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let p = plan("https://x/f.bin?b=2&token=a%2Fb", &opts(&[("checksum", sum), ("a", "1 2"), ("b", "3")]), Mode::Any, dest).unwrap();
        assert_eq!(p.url.as_str(), "https://x/f.bin?a=1+2&b=3&token=a%2Fb");
        assert!(p.checksum.is_some());
        // Untouched when nothing is set or taken: a signed URL stays byte for byte.
        let signed = "https://x/f.bin?X-Sig=a%2Bb&z=1&a=2";
        assert_eq!(plan(signed, &BTreeMap::new(), Mode::Any, dest).unwrap().url.as_str(), signed);
        // filename names the file in `any` mode and is not sent.
        let p = plan("https://x/download", &opts(&[("filename", "tool")]), Mode::Any, dest).unwrap();
        assert_eq!((p.url.as_str(), p.target), ("https://x/download", Target::File(dest.join("tool"))));
        let e = plan("https://x/d", &opts(&[("filename", "../../x")]), Mode::Any, dest).unwrap_err();
        assert_eq!(e, "filename query parameter contain path traversal");
    }

    #[test]
    fn modes_decide_the_target() {
        let dest = Path::new("t/local/bin/tool");
        let p = plan("https://x/releases/tool%20v1", &BTreeMap::new(), Mode::Any, Path::new("t/local")).unwrap();
        assert_eq!(p.target, Target::File(PathBuf::from("t/local/tool v1")), "the decoded file name");
        assert_eq!(plan("https://x/t", &BTreeMap::new(), Mode::File, dest).unwrap().target, Target::File(dest.into()));
        assert_eq!(plan("https://x/t.tgz", &BTreeMap::new(), Mode::File, dest).unwrap().target, Target::File(dest.into()));
        assert!(plan("https://x/t", &BTreeMap::new(), Mode::Dir, dest).unwrap_err().contains("needs an archive"));
        assert!(plan("https://x/dir/", &BTreeMap::new(), Mode::Any, dest).unwrap_err().contains("names a directory"));
        for bad in ["git::https://x/r", "s3::https://x/b", "ftp://x/f", "/etc/passwd", "https://x/a.tgz//sub"] {
            assert!(plan(bad, &BTreeMap::new(), Mode::Any, dest).is_err(), "{bad}");
        }
        let e = plan("git::https://x/r", &BTreeMap::new(), Mode::Any, dest).unwrap_err();
        assert!(e.starts_with("download not supported for scheme 'git'"), "{e}");
        assert!(plan("https::https://x/f", &BTreeMap::new(), Mode::Any, dest).is_ok());
    }

    #[test]
    fn destinations_stay_in_the_task_or_shared_alloc_dir() {
        let alloc = Path::new("/var/nomad/alloc/a1");
        let d = |s: &str| destination_beneath_alloc(s, alloc, "web");
        assert_eq!(d("local/").unwrap(), PathBuf::from("web/local"));
        assert_eq!(d("local/x/../y").unwrap(), PathBuf::from("web/local/y"));
        assert_eq!(d("../alloc/data").unwrap(), PathBuf::from("alloc/data"));
        assert_eq!(d("/var/nomad/alloc/a1/web/local/z").unwrap(), PathBuf::from("web/local/z"), "an absolute host path inside");
        assert_eq!(d("/var/nomad/alloc/a1/alloc/z").unwrap(), PathBuf::from("alloc/z"));
        assert_eq!(d("/etc/passwd").unwrap(), PathBuf::from("web/etc/passwd"), "outside: taken under the task dir, as Nomad");
        assert_eq!(d("").unwrap(), PathBuf::from("web"));
        for bad in ["../../etc", "../other", "../", "local/../../../x"] {
            assert_eq!(d(bad).unwrap_err(), "artifact destination path escapes alloc directory", "{bad}");
        }
    }
}
