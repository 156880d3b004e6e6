//! Unpacking every format (archives built here), the refusals that write nothing, the limits,
//! and the http getter against a server on 127.0.0.1:0.

use std::collections::BTreeMap;
use std::io::{Cursor, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::unpack::{Archive, Limits, unpack_dir, unpack_single};
use super::*;

const NO_LIMITS: Limits = Limits { max_bytes: 0, max_files: 0 };

/// A tar entry: name (written raw, so `..` and `/` names can be built), type, mode, data.
struct T<'a>(&'a str, tar::EntryType, u32, &'a [u8]);

fn tar_bytes(entries: &[T<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for T(name, kind, mode, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_entry_type(*kind);
        h.set_mode(*mode);
        h.set_mtime(1_600_000_000);
        h.set_size(data.len() as u64);
        if *kind == tar::EntryType::Symlink || *kind == tar::EntryType::Link {
            h.set_link_name("/etc/passwd").unwrap();
        }
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap()
}

fn compress(kind: Archive, raw: &[u8]) -> Vec<u8> {
    match kind {
        Archive::Tar => raw.to_vec(),
        Archive::TarGz | Archive::Gz => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(raw).unwrap();
            e.finish().unwrap()
        }
        Archive::TarBz2 | Archive::Bz2 => {
            let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
            e.write_all(raw).unwrap();
            e.finish().unwrap()
        }
        Archive::TarXz | Archive::Xz => {
            let mut e = lzma_rust2::XzWriter::new(Vec::new(), lzma_rust2::XzOptions::with_preset(1)).unwrap();
            e.write_all(raw).unwrap();
            e.finish().unwrap()
        }
        Archive::TarZst | Archive::Zst => ruzstd::encoding::compress_to_vec(raw, ruzstd::encoding::CompressionLevel::Fastest),
        Archive::Zip => unreachable!("zip_bytes"),
    }
}

/// A zip entry: name, mode, data; `None` data is a directory, a `Some("->target")` a symlink.
fn zip_bytes(entries: &[(&str, u32, Option<&[u8]>)]) -> Vec<u8> {
    let mut z = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, mode, data) in entries {
        let opts = zip::write::SimpleFileOptions::default().unix_permissions(*mode);
        match data {
            None => z.add_directory(*name, opts).unwrap(),
            Some(d) if d.starts_with(b"->") => z.add_symlink(*name, String::from_utf8_lossy(&d[2..]), opts).unwrap(),
            Some(d) => {
                z.start_file(*name, opts).unwrap();
                z.write_all(d).unwrap();
            }
        }
    }
    z.finish().unwrap().into_inner()
}

/// A temp alloc dir with `web/local` and `web/tmp`, and the archive written in it.
fn fixture(bytes: &[u8]) -> (tempfile::TempDir, Beneath, File) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("web/local")).unwrap();
    std::fs::create_dir_all(dir.path().join("web/tmp")).unwrap();
    std::fs::write(dir.path().join("web/tmp/archive"), bytes).unwrap();
    let f = File::open(dir.path().join("web/tmp/archive")).unwrap();
    let root = Beneath::open(dir.path()).unwrap();
    (dir, root, f)
}

fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    fn walk(base: &Path, d: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(base).unwrap().display().to_string());
            if p.is_dir() && !p.is_symlink() {
                walk(base, &p, out);
            }
        }
    }
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out.sort();
    out
}

fn good_tar() -> Vec<u8> {
    use tar::EntryType as E;
    tar_bytes(&[
        T("./", E::Directory, 0o755, b""),
        T("./bin/", E::Directory, 0o750, b""),
        T("./bin/tool", E::Regular, 0o4755, b"#!/bin/sh\necho hi\n"),
        T("README", E::Regular, 0o644, b"read me"),
        T("deep/er/file", E::Regular, 0o600, b"no dir entries before it"),
    ])
}

#[test]
fn every_tar_format_unpacks_into_the_destination_with_modes_and_no_setuid() {
    for kind in [Archive::Tar, Archive::TarGz, Archive::TarBz2, Archive::TarXz, Archive::TarZst] {
        let (dir, root, f) = fixture(&compress(kind, &good_tar()));
        unpack_dir(kind, &f, &root, Path::new("web/local/app"), NO_LIMITS, "app").unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        let app = dir.path().join("web/local/app");
        assert_eq!(listing(&app), ["README", "bin", "bin/tool", "deep", "deep/er", "deep/er/file"], "{kind:?}");
        assert_eq!(std::fs::read_to_string(app.join("bin/tool")).unwrap(), "#!/bin/sh\necho hi\n");
        let mode = |p: &str| std::fs::metadata(app.join(p)).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode("bin/tool"), 0o755, "{kind:?}: setuid stripped");
        assert_eq!(mode("bin"), 0o750, "{kind:?}: a directory gets its mode");
        assert_eq!(mode("deep/er/file"), 0o600);
        let mtime = std::fs::metadata(app.join("README")).unwrap().modified().unwrap();
        assert_eq!(mtime.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs(), 1_600_000_000);
    }
}

#[test]
fn a_zip_unpacks_and_single_compressed_files_become_one_file() {
    let zip = zip_bytes(&[("bin/", 0o755, None), ("bin/tool", 0o6755, Some(b"tool")), ("conf/app.json", 0o644, Some(b"{}"))]);
    let (dir, root, f) = fixture(&zip);
    unpack_dir(Archive::Zip, &f, &root, Path::new("web/local"), NO_LIMITS, "app.zip").unwrap();
    let local = dir.path().join("web/local");
    assert_eq!(listing(&local), ["bin", "bin/tool", "conf", "conf/app.json"]);
    assert_eq!(std::fs::metadata(local.join("bin/tool")).unwrap().permissions().mode() & 0o7777, 0o755);

    for kind in [Archive::Gz, Archive::Bz2, Archive::Xz, Archive::Zst] {
        let (dir, root, f) = fixture(&compress(kind, b"one file\n"));
        let mut out = File::create(dir.path().join("web/tmp/out")).unwrap();
        unpack_single(kind, &f, &mut out, NO_LIMITS, "x").unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        assert_eq!(std::fs::read_to_string(dir.path().join("web/tmp/out")).unwrap(), "one file\n", "{kind:?}");
        // Into a directory, go-getter refuses them, and so does this.
        let e = unpack_dir(kind, &f, &root, Path::new("web/local"), NO_LIMITS, "x").unwrap_err();
        assert!(e.ends_with("-compressed files can only unarchive to a single file"), "{kind:?}: {e}");
    }
    // A tar or zip in file mode must hold exactly one file.
    let (dir, _root, f) = fixture(&compress(Archive::TarGz, &good_tar()));
    let mut out = File::create(dir.path().join("web/tmp/out")).unwrap();
    assert_eq!(unpack_single(Archive::TarGz, &f, &mut out, NO_LIMITS, "app.tgz").unwrap_err(), "expected a single file: app.tgz");
    let one = tar_bytes(&[T("tool", tar::EntryType::Regular, 0o755, b"x")]);
    let (dir, _root, f) = fixture(&one);
    let mut out = File::create(dir.path().join("web/tmp/out")).unwrap();
    unpack_single(Archive::Tar, &f, &mut out, NO_LIMITS, "t.tar").unwrap();
    assert_eq!(std::fs::metadata(dir.path().join("web/tmp/out")).unwrap().permissions().mode() & 0o777, 0o755);
}

#[test]
fn escaping_and_linking_entries_refuse_the_archive_and_nothing_is_written() {
    use tar::EntryType as E;
    let fine = T("a-fine-file", E::Regular, 0o644, b"x");
    for (entries, why) in [
        (vec![T("../escape", E::Regular, 0o644, b"x")], "entry contains '..': ../escape"),
        (vec![T("ok/../../escape", E::Regular, 0o644, b"x")], "entry contains '..'"),
        (vec![T("/etc/cron.d/x", E::Regular, 0o644, b"x")], "entry is an absolute path: /etc/cron.d/x"),
        (vec![T("link", E::Symlink, 0o777, b"")], "\"link\" is a symbolic link"),
        (vec![T("hard", E::Link, 0o644, b"")], "\"hard\" is a hard link"),
        (vec![T("fifo", E::Fifo, 0o644, b"")], "\"fifo\" is not a regular file or directory"),
    ] {
        // A good entry first: the refusal comes before anything is written.
        let mut all = vec![T(fine.0, fine.1, fine.2, fine.3)];
        all.extend(entries);
        let (dir, root, f) = fixture(&compress(Archive::TarGz, &tar_bytes(&all)));
        let e = unpack_dir(Archive::TarGz, &f, &root, Path::new("web/local/app"), NO_LIMITS, "app.tgz").unwrap_err();
        assert!(e.contains(why), "{why}: {e}");
        assert!(!dir.path().join("web/local/app").exists(), "{why}: nothing written");
        assert!(!dir.path().join("escape").exists() && !dir.path().join("web/escape").exists());
    }
    for (entries, why) in [
        (vec![("ok", 0o644, Some(&b"x"[..])), ("../escape", 0o644, Some(&b"x"[..]))], "entry contains '..'"),
        (vec![("ok", 0o644, Some(&b"x"[..])), ("/abs", 0o644, Some(&b"x"[..]))], "entry is an absolute path: /abs"),
        (vec![("ok", 0o644, Some(&b"x"[..])), ("link", 0o777, Some(&b"->/etc/passwd"[..]))], "\"link\" is a symbolic link"),
    ] {
        let (dir, root, f) = fixture(&zip_bytes(&entries));
        let e = unpack_dir(Archive::Zip, &f, &root, Path::new("web/local"), NO_LIMITS, "app.zip").unwrap_err();
        assert!(e.contains(why), "{why}: {e}");
        assert!(listing(&dir.path().join("web/local")).is_empty(), "{why}: nothing written");
    }
}

#[test]
fn a_symlink_the_task_left_in_the_destination_is_never_followed() {
    let outside = tempfile::tempdir().unwrap();
    let (dir, root, f) = fixture(&tar_bytes(&[T("evil/x", tar::EntryType::Regular, 0o644, b"pwned")]));
    std::os::unix::fs::symlink(outside.path(), dir.path().join("web/local/evil")).unwrap();
    let e = unpack_dir(Archive::Tar, &f, &root, Path::new("web/local"), NO_LIMITS, "t.tar").unwrap_err();
    assert!(e.contains("symlink"), "{e}");
    assert!(listing(outside.path()).is_empty(), "nothing written through the link");
}

#[test]
fn file_count_and_size_limits_stop_unpacking() {
    use tar::EntryType as E;
    let tar = tar_bytes(&[T("a", E::Regular, 0o644, b"1234"), T("b", E::Regular, 0o644, b"5678"), T("c", E::Regular, 0o644, b"9")]);
    let (dir, root, f) = fixture(&tar);
    let e = unpack_dir(Archive::Tar, &f, &root, Path::new("web/local"), Limits { max_bytes: 0, max_files: 2 }, "t.tar").unwrap_err();
    assert_eq!(e, "tar archive contains too many files: 3 > 2");
    let e = unpack_dir(Archive::Tar, &f, &root, Path::new("web/local"), Limits { max_bytes: 8, max_files: 0 }, "t.tar").unwrap_err();
    assert_eq!(e, "tar archive larger than limit: 8");
    assert!(listing(&dir.path().join("web/local")).is_empty());
    unpack_dir(Archive::Tar, &f, &root, Path::new("web/local"), Limits { max_bytes: 9, max_files: 3 }, "t.tar").unwrap();

    let zip = zip_bytes(&[("a", 0o644, Some(&b"1234"[..])), ("b", 0o644, Some(&b"5678"[..]))]);
    let (_dir, root, f) = fixture(&zip);
    let e = unpack_dir(Archive::Zip, &f, &root, Path::new("web/local"), Limits { max_bytes: 0, max_files: 1 }, "z.zip").unwrap_err();
    assert_eq!(e, "zip archive contains too many files: 2 > 1");

    // A compressed file is cut off at the limit while it is written.
    let (dir, _root, f) = fixture(&compress(Archive::Gz, &vec![b'z'; 1 << 20]));
    let mut out = File::create(dir.path().join("web/tmp/out")).unwrap();
    let e = unpack_single(Archive::Gz, &f, &mut out, Limits { max_bytes: 1000, max_files: 0 }, "z.gz").unwrap_err();
    assert_eq!(e, "gzip-compressed file larger than limit: 1000");
    assert!(std::fs::metadata(dir.path().join("web/tmp/out")).unwrap().len() <= 1000);
}

/// Serves `files` by path on 127.0.0.1:0, counting requests.
async fn serve(files: BTreeMap<&'static str, Vec<u8>>) -> (String, Arc<AtomicU64>) {
    use hyper::service::service_fn;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicU64::new(0));
    let files = Arc::new(files);
    let counter = hits.clone();
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else { return };
            let (files, counter) = (files.clone(), counter.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let body = files.get(req.uri().path()).cloned();
                    async move {
                        let (status, body) = match body {
                            Some(b) => (200, b),
                            None => (404, b"not found".to_vec()),
                        };
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder().status(status).body(http_body_util::Full::new(bytes::Bytes::from(body))).unwrap(),
                        )
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(conn), svc).await;
            });
        }
    });
    (format!("http://{addr}"), hits)
}

fn request(dir: &Path, source: String, options: &[(&str, &str)], mode: Mode, dest: &str) -> Request {
    Request {
        source,
        options: options.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        headers: BTreeMap::new(),
        mode,
        alloc_dir: dir.to_path_buf(),
        task: "web".into(),
        destination: PathBuf::from(dest),
    }
}

#[tokio::test]
async fn the_http_getter_checks_checksums_before_anything_lands_and_skips_a_matching_file() {
    let one = tar_bytes(&[T("tool", tar::EntryType::Regular, 0o755, b"tool\n")]);
    let (base, hits) = serve(BTreeMap::from([
        ("/f.txt", b"hello\n".to_vec()),
        ("/big", vec![0u8; 4096]),
        ("/app.tgz", compress(Archive::TarGz, &good_tar())),
        ("/tool.tar.gz", compress(Archive::TarGz, &one)),
    ]))
    .await;
    let (dir, _root, _f) = fixture(b"");
    std::fs::remove_file(dir.path().join("web/tmp/archive")).unwrap();
    let getter = HttpGetter::new(ArtifactConfig::default());
    let good = "sha256:5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
    let bad = "md5:00000000000000000000000000000000";

    let e = getter.get(&request(dir.path(), format!("{base}/f.txt"), &[("checksum", bad)], Mode::Any, "web/local")).await.unwrap_err();
    assert!(e.starts_with("Checksums did not match for local/f.txt.\nExpected: 00000000000000000000000000000000\nGot: b1946ac9"), "{e}");
    assert!(listing(&dir.path().join("web/local")).is_empty(), "no partial file");
    assert!(listing(&dir.path().join("web/tmp")).is_empty(), "no temp file left");

    getter.get(&request(dir.path(), format!("{base}/f.txt"), &[("checksum", good)], Mode::Any, "web/local")).await.unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("web/local/f.txt")).unwrap(), "hello\n");
    let before = hits.load(Ordering::SeqCst);
    getter.get(&request(dir.path(), format!("{base}/f.txt"), &[("checksum", good)], Mode::Any, "web/local")).await.unwrap();
    assert_eq!(hits.load(Ordering::SeqCst), before, "a file that already matches is not fetched again");

    let e = getter.get(&request(dir.path(), format!("{base}/missing"), &[], Mode::Any, "web/local")).await.unwrap_err();
    assert_eq!(e, "bad response code: 404");

    // Archives: unpacked into the destination, or their one file at it in file mode.
    getter.get(&request(dir.path(), format!("{base}/app.tgz"), &[], Mode::Any, "web/local/app")).await.unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("web/local/app/bin/tool")).unwrap(), "#!/bin/sh\necho hi\n");
    getter.get(&request(dir.path(), format!("{base}/tool.tar.gz"), &[], Mode::File, "web/local/bin/tool")).await.unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("web/local/bin/tool")).unwrap(), "tool\n");
    assert!(listing(&dir.path().join("web/tmp")).is_empty(), "no temp file left");

    let small = HttpGetter::new(ArtifactConfig { http_max_size: 1000, ..ArtifactConfig::default() });
    let e = small.get(&request(dir.path(), format!("{base}/big"), &[], Mode::File, "web/local/big")).await.unwrap_err();
    assert!(e.contains("http_max_size (1000 bytes)"), "{e}");
    assert!(!dir.path().join("web/local/big").exists());
    assert!(listing(&dir.path().join("web/tmp")).is_empty());
}
