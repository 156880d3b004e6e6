//! `operator snapshot save|inspect|restore` against an in-process server.

use nomad_server::testing;

use crate::support::{Api, example, nomad};

#[tokio::test]
async fn save_inspect_and_restore_bring_the_state_back() {
    let api = Api::start().await;
    api.server.register_node(testing::node("4e0d0001-aaaa-bbbb-cccc-000000000001")).await;
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    let alloc = api.place("hello", "4e0d0001-aaaa-bbbb-cccc-000000000001", 0).await;
    let saved_index = api.server.store.snapshot().index;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backup.snap");
    let file = file.to_str().unwrap();
    api.nomad(&["operator", "snapshot", "save", file]).await.expect_code(0).stdout_has(&format!("State file written to {file}"));
    api.nomad(&["operator", "snapshot", "save", file])
        .await
        .expect_code(1)
        .stderr_has(&format!("Destination file already exists: {file:?}"));
    let size = nomad_server::snapshot::read_archive(&std::fs::read(file).unwrap()).unwrap().meta.size;
    nomad(&["operator", "snapshot", "inspect", file])
        .await
        .expect_code(0)
        .stdout_has(&format!("ID      = 0-{saved_index}-"))
        .stdout_has(&format!("Size    = {size}\nIndex   = {saved_index}\nTerm    = 0\nVersion = 1"));

    api.nomad(&["job", "stop", "-purge", "-detach", "hello"]).await.expect_code(0);
    assert!(api.server.store.snapshot().job("default", "hello").is_none());
    api.nomad(&["operator", "snapshot", "restore", file]).await.expect_code(0).stdout_has("Snapshot Restored");
    let restored = api.server.store.snapshot();
    assert!(restored.job("default", "hello").is_some(), "the job is back");
    assert_eq!(restored.alloc(&alloc.id).map(|a| a.client_status), Some(nomad_proto::ClientStatus::Running), "so is its alloc");
    api.nomad(&["job", "status", "hello"]).await.expect_code(0).stdout_has("ID            = hello");
}

#[tokio::test]
async fn a_damaged_file_is_refused_by_inspect_and_by_the_server() {
    let api = Api::start().await;
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("backup.snap");
    let file = file.to_str().unwrap();
    api.nomad(&["operator", "snapshot", "save", file]).await.expect_code(0);
    let mut bytes = std::fs::read(file).unwrap();
    bytes.truncate(bytes.len() - 16);
    std::fs::write(file, &bytes).unwrap();
    nomad(&["operator", "snapshot", "inspect", file]).await.expect_code(1).stderr_has("Error verifying snapshot: ");
    api.nomad(&["operator", "snapshot", "restore", file])
        .await
        .expect_code(1)
        .stderr_has("Failed to get restore snapshot: Unexpected response code: 400 (failed to restore from snapshot: ");
    assert!(api.server.store.snapshot().job("default", "hello").is_some(), "nothing was restored");
    nomad(&["operator", "snapshot", "inspect", dir.path().join("missing.snap").to_str().unwrap()])
        .await
        .expect_code(1)
        .stderr_has("Error opening snapshot file: ");
}
