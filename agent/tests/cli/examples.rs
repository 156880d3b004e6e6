//! The example job files and the script that builds the oci example's rootfs.

use crate::support::{example, nomad};

#[tokio::test]
async fn every_example_validates_with_the_binary() {
    for name in ["hello.nomad.hcl", "web.nomad.hcl", "oci-batch.nomad.hcl", "system.nomad.hcl"] {
        nomad(&["job", "validate", &example(name)]).await.expect_code(0).stdout_has("Job validation successful");
    }
}

#[test]
fn make_busybox_rootfs_builds_a_rootfs_with_applets() {
    nomad_testkit::require_prereqs!(nomad_testkit::Prereq::Busybox);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-busybox-rootfs");
    let out = std::process::Command::new(&script).arg(&root).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_link(root.join("bin/sh")).unwrap().to_str(), Some("busybox"));
    assert!(root.join("bin/busybox").is_file());
    assert!(std::fs::read_to_string(root.join("etc/passwd")).unwrap().starts_with("root:x:0:0:"));
    let usage = std::process::Command::new(&script).output().unwrap();
    assert_eq!(usage.status.code(), Some(2), "no directory is a usage error");
}
