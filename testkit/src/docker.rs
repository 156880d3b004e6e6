//! Docker images for tests, made on this machine (no registry is reachable): the busybox root
//! filesystem of `scripts/make-busybox-rootfs`, archived deterministically (sorted, epoch times,
//! root owner) and imported with `docker import`. The tag is the archive's digest, so every test
//! process on the machine asks for the same name, imports it only when the Engine lacks it, and
//! leaves it in place for the next one.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// `nomad-rs-test/busybox:<digest>`: busybox with no command of its own (tasks name one).
pub fn busybox_image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| import("nomad-rs-test/busybox", &[]).unwrap_or_else(|e| panic!("busybox image: {e}")))
}

/// `nomad-rs-test/pause:<digest>`: busybox whose command sleeps until it is killed, for the
/// docker driver's `infra_image`.
pub fn pause_image() -> &'static str {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE.get_or_init(|| {
        import("nomad-rs-test/pause", &[r#"CMD ["/bin/sleep", "infinity"]"#]).unwrap_or_else(|e| panic!("pause image: {e}"))
    })
}

/// `docker.io/envoyproxy/envoy:v<version>` (the name Nomad's default `connect.sidecar_image`
/// resolves to for that version), made from the host's Envoy binary at `envoy`, which must be
/// that version: the binary as `/usr/local/bin/envoy` (the entrypoint) and the shared libraries
/// `ldd` lists at their paths, nothing else. The image carries a label with the archive's digest
/// and is imported again only when the Engine's copy differs.
pub fn envoy_image(envoy: &Path, version: &str) -> Result<String, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("make a temp dir: {e}"))?;
    let rootfs = dir.path().join("rootfs");
    let place = |from: &Path, to: &Path| -> Result<(), String> {
        let dest = rootfs.join(to.strip_prefix("/").unwrap_or(to));
        std::fs::create_dir_all(dest.parent().expect("a parent")).map_err(|e| format!("mkdir for {}: {e}", dest.display()))?;
        std::fs::copy(from, &dest).map(drop).map_err(|e| format!("copy {} to {}: {e}", from.display(), dest.display()))
    };
    place(envoy, Path::new("/usr/local/bin/envoy"))?;
    let ldd = run(Command::new("ldd").arg(envoy), None)?;
    for line in String::from_utf8_lossy(&ldd).lines() {
        // `libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)` or `/lib64/ld-linux-x86-64.so.2 (0x...)`.
        let path = line.split("=>").last().and_then(|rest| rest.split_whitespace().next()).filter(|p| p.starts_with('/'));
        if let Some(path) = path {
            place(Path::new(path), Path::new(path))?;
        }
    }
    std::fs::create_dir_all(rootfs.join("tmp")).map_err(|e| format!("mkdir tmp: {e}"))?;
    let tar = run(
        Command::new("tar")
            .args(["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-C"])
            .arg(&rootfs)
            .args(["-c", "."]),
        None,
    )?;
    drop(dir);
    let digest = run(&mut Command::new("sha256sum"), Some(&tar))?;
    let digest = String::from_utf8_lossy(&digest).chars().take(16).collect::<String>();
    let name = format!("docker.io/envoyproxy/envoy:v{version}");
    let label = "org.nomad-rs.test.digest";
    let format = format!("{{{{index .Config.Labels \"{label}\"}}}}");
    let current = run(Command::new("docker").args(["image", "inspect", "--format", &format, &name]), None);
    if current.is_ok_and(|l| String::from_utf8_lossy(&l).trim() == digest) {
        return Ok(name);
    }
    let entrypoint = r#"ENTRYPOINT ["/usr/local/bin/envoy"]"#;
    let label_change = format!("LABEL {label}={digest}");
    run(Command::new("docker").args(["import", "--change", entrypoint, "--change", &label_change, "-", &name]), Some(&tar))?;
    Ok(name)
}

fn run(cmd: &mut Command, input: Option<&[u8]>) -> Result<Vec<u8>, String> {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin.write_all(data).map_err(|e| format!("{what}: write stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(out.stdout)
}

/// Imports the busybox rootfs as `<repo>:<digest>` with the `docker import --change`s given,
/// unless the Engine has it already; its name.
pub fn import(repo: &str, changes: &[&str]) -> Result<String, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("make a temp dir: {e}"))?;
    let rootfs = dir.path().join("rootfs");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-busybox-rootfs");
    run(Command::new("bash").arg(script).arg(&rootfs), None)?;
    let tar = run(
        Command::new("tar")
            .args(["--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner", "-C"])
            .arg(&rootfs)
            .args(["-c", "."]),
        None,
    );
    drop(dir);
    let tar = tar?;
    let mut hashed = tar.clone();
    hashed.extend(changes.join("\n").as_bytes());
    let digest = run(&mut Command::new("sha256sum"), Some(&hashed))?;
    let tag = String::from_utf8_lossy(&digest).chars().take(16).collect::<String>();
    let name = format!("{repo}:{tag}");
    if run(Command::new("docker").args(["image", "inspect", &name]), None).is_ok() {
        return Ok(name);
    }
    let mut import = Command::new("docker");
    import.arg("import");
    for change in changes {
        import.args(["--change", change]);
    }
    run(import.args(["-", &name]), Some(&tar))?;
    Ok(name)
}
