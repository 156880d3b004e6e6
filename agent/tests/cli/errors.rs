//! What goes wrong: no agent, bad files, bad flags; and where settings come from.

use crate::support::{Api, closed_port, example, nomad, nomad_with};

#[tokio::test]
async fn a_refused_connection_says_what_to_check_and_exits_1() {
    let addr = format!("http://127.0.0.1:{}", closed_port());
    let run = nomad(&["job", "status", "-address", &addr]).await;
    run.expect_code(1);
    assert_eq!(
        run.stderr.trim_end(),
        format!(
            "Error querying jobs: Get \"{addr}/v1/jobs\": connection refused — is `nomad-rs agent` running? Set NOMAD_ADDR or -address"
        )
    );
    nomad_with(&["node", "status"], &[("NOMAD_ADDR", &addr)], "").await.expect_code(1).stderr_has("Error querying node status: Get \"");
}

#[tokio::test]
async fn a_bad_job_file_exits_1_with_file_line_and_column_before_any_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.nomad.hcl");
    std::fs::write(&path, "job \"x\" {\n  group \"g\" {\n    count = \"many\"\n  }\n}\n").unwrap();
    // No server at this address: parsing fails first, so it is never contacted.
    let addr = format!("http://127.0.0.1:{}", closed_port());
    let run = nomad(&["job", "run", "-address", &addr, path.to_str().unwrap()]).await;
    run.expect_code(1).stderr_has(&format!("Error parsing job file: {}:3:", path.display()));
    assert!(!run.stderr.contains("connection refused"), "{}", run.stderr);
    nomad(&["job", "validate", path.to_str().unwrap()]).await.expect_code(1).stderr_has(&format!("{}:3:", path.display()));
    nomad(&["job", "run", "/no/such/file.hcl"]).await.expect_code(1).stderr_has("Error reading job file /no/such/file.hcl");
}

#[tokio::test]
async fn the_job_file_can_come_from_stdin_with_variables() {
    let api = Api::start().await;
    let src = "variable \"n\" {\n  type = number\n}\njob \"from-stdin\" {\n  datacenters = [\"dc1\"]\n  group \"g\" {\n    count = var.n\n    task \"t\" {\n      driver = \"raw_exec\"\n      config {\n        command = \"/bin/true\"\n      }\n    }\n  }\n}\n";
    let run = nomad_with(&["job", "run", "-detach", "-var", "n=3", "-address", &api.addr, "-"], &[], src).await;
    run.expect_code(0);
    let job = api.server.store.snapshot().job("default", "from-stdin").cloned().expect("registered");
    assert_eq!(job.task_groups[0].count, 3);
    // NOMAD_VAR_ works too, and -var wins over it.
    let env = [("NOMAD_VAR_n", "5")];
    nomad_with(&["job", "run", "-detach", "-address", &api.addr, "-"], &env, src).await.expect_code(0);
    assert_eq!(api.server.store.snapshot().job("default", "from-stdin").unwrap().task_groups[0].count, 5);
    // An unset variable is a parse error.
    nomad_with(&["job", "validate", "-"], &[], src).await.expect_code(1).stderr_has("Error parsing job file:");
}

#[tokio::test]
async fn nomad_addr_is_used_and_the_flag_beats_it() {
    let api = Api::start().await;
    nomad_with(&["job", "status"], &[("NOMAD_ADDR", &api.addr)], "").await.expect_code(0).stdout_has("No running jobs");
    let dead = format!("http://127.0.0.1:{}", closed_port());
    nomad_with(&["job", "status", "-address", &api.addr], &[("NOMAD_ADDR", &dead)], "").await.expect_code(0);
    nomad_with(&["job", "status", "--address", &api.addr], &[("NOMAD_ADDR", &dead)], "").await.expect_code(0);
}

#[tokio::test]
async fn usage_errors_exit_1_and_help_exits_0() {
    nomad(&["job", "run"]).await.expect_code(1).stderr_has("<FILE>");
    nomad(&["job", "status", "-bogus"]).await.expect_code(1).stderr_has("unexpected argument '-bogus'");
    nomad(&["job", "-h"]).await.expect_code(0).stdout_has("Usage: nomad-rs job");
    nomad(&["job", "run", "-address", "unix:///tmp/nomad.sock", &example("hello.nomad.hcl")])
        .await
        .expect_code(1)
        .stderr_has("unix sockets are not supported");
}

#[test]
fn a_reader_that_went_away_ends_the_command_quietly_not_with_a_panic() {
    use std::os::unix::process::ExitStatusExt;
    // The read end is closed before the command starts: its first write meets a broken pipe.
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    drop(read_end);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nomad-rs"))
        .arg("version")
        .stdout(std::process::Stdio::from(write_end))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "printed on a broken pipe: {stderr}");
    assert_eq!(out.status.signal(), Some(nix::libc::SIGPIPE), "ends as a Go CLI does: {:?}", out.status);
}

#[tokio::test]
async fn version_and_dash_version_print_the_same_line() {
    let word = nomad(&["version"]).await;
    word.expect_code(0);
    assert!(word.stdout.starts_with("nomad-rs v") && word.stdout.contains("(Nomad API "), "{}", word.stdout);
    for flag in ["-version", "--version"] {
        let run = nomad(&[flag]).await;
        run.expect_code(0);
        assert_eq!(run.stdout, word.stdout, "{flag}");
    }
}

#[tokio::test]
async fn a_nomad_command_nomad_rs_lacks_says_so_and_exits_1() {
    for (args, name) in [
        (&["job", "restart", "web"][..], "job restart"),
        (&["job", "-namespace", "prod", "restart", "web"], "job restart"),
        (&["job", "allocs", "web"], "job allocs"),
        (&["quota", "apply", "quota.hcl"], "quota apply"),
        (&["acl", "auth-method", "list"], "acl auth-method list"),
        (&["volume", "snapshot", "list"], "volume snapshot list"),
        (&["operator", "snapshot", "state", "backup.snap"], "operator snapshot state"),
        (&["deployment", "unblock", "d1"], "deployment unblock"),
        (&["operator", "autopilot", "get-config"], "operator autopilot get-config"),
    ] {
        let run = nomad(args).await;
        run.expect_code(1);
        assert_eq!(run.stderr, format!("\"nomad-rs {name}\" is not implemented yet\n"), "{args:?}");
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
    }
    // Nomad's old spelling of a command we have points at it.
    nomad(&["run", "x.nomad.hcl"]).await.expect_code(1).stderr_has("\"nomad-rs run\" is not implemented yet; use \"nomad-rs job run\"");
    // A word Nomad has no command for stays a usage error: 127 at the top, as Nomad's CLI, else 1.
    let run = nomad(&["bogus"]).await;
    run.expect_code(127).stderr_has("unrecognized subcommand 'bogus'");
    assert!(!run.stderr.contains("not implemented"), "{}", run.stderr);
    nomad(&["job", "bogus"]).await.expect_code(1).stderr_has("unrecognized subcommand 'bogus'");
}

#[tokio::test]
async fn help_and_usage_spell_flags_with_one_dash_as_nomad_does() {
    let run = nomad(&["job", "run", "-help"]).await;
    run.expect_code(0);
    for flag in ["-detach", "-check-index", "-var-file", "-address", "-output", "-json", "-h, -help"] {
        assert!(run.stdout.contains(&format!(" {flag}")), "{flag} in:\n{}", run.stdout);
    }
    assert!(!run.stdout.contains("--"), "a double-dash flag in:\n{}", run.stdout);
    for args in [&["agent", "-h"][..], &["node", "drain", "-help"], &["-help"], &["alloc", "logs", "-h"]] {
        let run = nomad(args).await;
        run.expect_code(0);
        assert!(!run.stdout.contains("--"), "{args:?}:\n{}", run.stdout);
    }
    // Usage errors too.
    let run = nomad(&["job", "run", "-detach"]).await;
    run.expect_code(1);
    assert!(run.stderr.contains("Usage: nomad-rs job run") && run.stderr.contains("try '-help'"), "{}", run.stderr);
    assert!(!run.stderr.contains("--"), "{}", run.stderr);
}
