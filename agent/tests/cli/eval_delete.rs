//! `eval delete` and `operator scheduler get-config|set-config` against an in-process server.

use crate::support::{Api, example, nomad_with};

#[tokio::test]
async fn eval_delete_needs_the_paused_broker_then_deletes_by_id_and_by_filter() {
    let api = Api::start().await;
    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    let first = api.server.store.snapshot().evals().next().unwrap().id.clone();

    api.nomad(&["eval", "delete", &first])
        .await
        .expect_code(1)
        .stderr_has("Eval broker is not paused")
        .stdout_has("nomad-rs operator scheduler set-config -pause-eval-broker=true");
    api.nomad(&["operator", "scheduler", "get-config"])
        .await
        .expect_code(0)
        .stdout_has("Scheduler Algorithm           = binpack")
        .stdout_has("Pause Eval Broker             = false")
        .stdout_has("Modify Index                  = 0");
    api.nomad(&["operator", "scheduler", "set-config", "-pause-eval-broker=true"])
        .await
        .expect_code(0)
        .stdout_has("Scheduler configuration updated!");
    api.nomad(&["operator", "scheduler", "get-config"]).await.expect_code(0).stdout_has("Pause Eval Broker             = true");
    api.nomad(&["operator", "scheduler", "set-config", "-scheduler-algorithm=spread"])
        .await
        .expect_code(1)
        .stderr_has("Error setting scheduler configuration: ")
        .stderr_has("the spread scheduler algorithm is not supported by nomad-rs");
    api.nomad(&["operator", "scheduler", "set-config", "-check-index=999", "-pause-eval-broker=false"])
        .await
        .expect_code(1)
        .stderr_has("Error performing check index set: check-index 999 does not match");

    api.nomad(&["eval", "delete"])
        .await
        .expect_code(1)
        .stderr_has("Error validating command args and flags: evaluation ID or filter flag required");
    api.nomad(&["eval", "delete", &first]).await.expect_code(0).stdout_has("Successfully deleted 1 evaluation");
    assert!(api.server.store.snapshot().eval(&first).is_none());

    api.nomad(&["job", "run", "-detach", &example("hello.nomad.hcl")]).await.expect_code(0);
    let filter = r#"JobID == "hello""#;
    let with_address = |args: &[&'static str]| -> Vec<String> {
        let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        all.extend(["-address".to_string(), api.addr.clone()]);
        all
    };
    let args = with_address(&["eval", "delete", "-filter", filter]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    nomad_with(&args, &[], "n\n")
        .await
        .expect_code(0)
        .stdout_has("Are you sure you want to delete 1 evals? [y/N]")
        .stdout_has("Cancelling eval deletion")
        .stdout_has("No evaluations were deleted");
    assert_eq!(api.server.store.snapshot().evals().count(), 1);
    nomad_with(&args, &[], "y\n").await.expect_code(0).stdout_has("Successfully deleted 1 evaluation");
    assert_eq!(api.server.store.snapshot().evals().count(), 0);
}
