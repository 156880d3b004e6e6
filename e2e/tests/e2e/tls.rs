//! TLS on the HTTP API against a real dev agent: certificates made by `nomad-rs tls ca|cert
//! create`, `tls { http, verify_https_client }`, the CLI over https with Nomad's environment
//! variables, a client without a certificate refused, plain HTTP answered with Go's 400, and a
//! certificate rotated on disk served after SIGHUP without a restart.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

use nomad_e2e::{Agent, AgentOptions, wait_for};

use crate::SETTLE;

/// Runs `nomad-rs args...` in `cwd` with only the given `NOMAD_*` variables.
fn run(cwd: &Path, args: &[&str], env: &[(&str, String)]) -> (i32, String, String) {
    let mut cmd = Command::new(nomad_e2e::binary());
    cmd.current_dir(cwd).args(args);
    for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("NOMAD_")) {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run nomad-rs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn ok(cwd: &Path, args: &[&str]) -> String {
    let (code, stdout, stderr) = run(cwd, args, &[]);
    assert_eq!(code, 0, "{args:?}\n{stdout}\n{stderr}");
    stdout
}

#[test]
fn an_https_agent_with_client_verification_serves_the_cli_refuses_others_and_reloads_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    let out = ok(&pki, &["tls", "ca", "create"]);
    assert!(out.contains("==> CA certificate saved to: nomad-agent-ca.pem"), "{out}");
    ok(&pki, &["tls", "cert", "create", "-server"]);
    ok(&pki, &["tls", "cert", "create", "-cli"]);
    let (code, _, stderr) = run(&pki, &["tls", "cert", "create", "-server"], &[]);
    assert_eq!(code, 1);
    assert!(stderr.contains("'global-server-nomad.pem' already exists"), "{stderr}");

    let p = |name: &str| pki.join(name).display().to_string();
    let config = format!(
        "tls {{\n  http = true\n  ca_file = {:?}\n  cert_file = {:?}\n  key_file = {:?}\n  verify_https_client = true\n}}\n",
        p("nomad-agent-ca.pem"),
        p("global-server-nomad.pem"),
        p("global-server-nomad-key.pem"),
    );
    let agent_dir = dir.path().join("agent");
    std::fs::create_dir(&agent_dir).unwrap();
    let agent =
        Agent::start("dev", &agent_dir, AgentOptions { args: vec!["-dev".into()], config: Some(config), ..Default::default() }).unwrap();
    let addr = format!("https://{}", agent.http_addr);
    let cli_env = vec![
        ("NOMAD_ADDR", addr.clone()),
        ("NOMAD_CACERT", p("nomad-agent-ca.pem")),
        ("NOMAD_CLIENT_CERT", p("global-cli-nomad.pem")),
        ("NOMAD_CLIENT_KEY", p("global-cli-nomad-key.pem")),
    ];

    // The CLI with the environment variables works (once the dev node is up).
    wait_for("the CLI to list the dev node over https", SETTLE, || {
        let (code, stdout, _) = run(dir.path(), &["node", "status"], &cli_env);
        (code == 0 && stdout.contains("ready")).then_some(())
    })
    .map_err(|e| format!("{e}\n{}", agent.logs()))
    .unwrap();
    // The same with flags instead of variables.
    let (code, stdout, stderr) = run(
        dir.path(),
        &[
            "server",
            "members",
            "-address",
            &addr,
            "-ca-cert",
            &p("nomad-agent-ca.pem"),
            "-client-cert",
            &p("global-cli-nomad.pem"),
            "-client-key",
            &p("global-cli-nomad-key.pem"),
        ],
        &[],
    );
    assert_eq!(code, 0, "{stdout}\n{stderr}");

    // Without a client certificate: refused.
    let no_cert = vec![("NOMAD_ADDR", addr.clone()), ("NOMAD_CACERT", p("nomad-agent-ca.pem"))];
    let (code, stdout, stderr) = run(dir.path(), &["node", "status"], &no_cert);
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(!stdout.contains("ready"), "{stdout}");
    // Without the CA: the agent's certificate is not trusted.
    let no_ca = vec![
        ("NOMAD_ADDR", addr.clone()),
        ("NOMAD_CLIENT_CERT", p("global-cli-nomad.pem")),
        ("NOMAD_CLIENT_KEY", p("global-cli-nomad-key.pem")),
    ];
    assert_eq!(run(dir.path(), &["node", "status"], &no_ca).0, 1);
    // NOMAD_SKIP_VERIFY trusts any certificate (the client's is still needed).
    let mut skip = no_ca.clone();
    skip.push(("NOMAD_SKIP_VERIFY", "true".into()));
    assert_eq!(run(dir.path(), &["node", "status"], &skip).0, 0);

    // Plain HTTP on the HTTPS port: Go's 400.
    let mut tcp = std::net::TcpStream::connect(&agent.http_addr).unwrap();
    tcp.set_read_timeout(Some(SETTLE)).unwrap();
    tcp.write_all(b"GET /v1/status/leader HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut answer = String::new();
    tcp.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.0 400 Bad Request"), "{answer}");
    assert!(answer.contains("Client sent an HTTP request to an HTTPS server."), "{answer}");

    // Rotation: a new server certificate (with one more name) is written over the old files; the
    // name is accepted only once the agent serves the new certificate.
    let rotated = dir.path().join("rotated");
    std::fs::create_dir(&rotated).unwrap();
    std::fs::copy(pki.join("nomad-agent-ca.pem"), rotated.join("nomad-agent-ca.pem")).unwrap();
    std::fs::copy(pki.join("nomad-agent-ca-key.pem"), rotated.join("nomad-agent-ca-key.pem")).unwrap();
    ok(&rotated, &["tls", "cert", "create", "-server", "-additional-dnsname", "rotated.nomad.test"]);
    let mut by_new_name = cli_env.clone();
    by_new_name.push(("NOMAD_TLS_SERVER_NAME", "rotated.nomad.test".into()));
    assert_eq!(run(dir.path(), &["server", "members"], &by_new_name).0, 1, "the old certificate does not have the new name");
    for f in ["global-server-nomad.pem", "global-server-nomad-key.pem"] {
        // Written beside, then renamed: the agent never reads half a file.
        let tmp = pki.join(format!("{f}.new"));
        std::fs::copy(rotated.join(f), &tmp).unwrap();
        std::fs::rename(&tmp, pki.join(f)).unwrap();
    }
    let pid = agent.pid().expect("a running agent");
    agent.signal(nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_for("the rotated certificate to be served", SETTLE, || {
        (run(dir.path(), &["server", "members"], &by_new_name).0 == 0).then_some(())
    })
    .map_err(|e| format!("{e}\n{}", agent.logs()))
    .unwrap();
    assert_eq!(agent.pid(), Some(pid), "the same process: no restart");
    assert_eq!(run(dir.path(), &["node", "status"], &cli_env).0, 0, "the CLI still works");
    assert!(agent.logs().contains("Caught signal: hangup"), "{}", agent.logs());
}

/// `tls {}` for an agent with `cert`'s files from `pki`, client certificates required.
fn tls_block(pki: &Path, cert: &str) -> String {
    let p = |name: &str| pki.join(name).display().to_string();
    format!(
        "tls {{\n  http = true\n  ca_file = {:?}\n  cert_file = {:?}\n  key_file = {:?}\n  verify_https_client = true\n}}\n",
        p("nomad-agent-ca.pem"),
        p(&format!("{cert}.pem")),
        p(&format!("{cert}-key.pem")),
    )
}

#[test]
fn agents_forward_and_relay_exec_to_each_other_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    ok(&pki, &["tls", "ca", "create"]);
    for role in ["-server", "-client", "-cli"] {
        ok(&pki, &["tls", "cert", "create", role]);
    }
    let server = Agent::start(
        "server1",
        &dir.path().join("server1"),
        AgentOptions {
            args: vec!["-server".into(), "-bootstrap-expect".into(), "1".into()],
            config: Some(tls_block(&pki, "global-server-nomad")),
            ..Default::default()
        },
    )
    .unwrap();
    let raw_exec = "plugin \"raw_exec\" {\n  config {\n    enabled = true\n  }\n}\n";
    let client = |name: &str| {
        let opts = AgentOptions {
            args: vec!["-client".into(), "-servers".into(), server.rpc_addr.clone()],
            config: Some(format!("{}{raw_exec}", tls_block(&pki, "global-client-nomad"))),
            ..Default::default()
        };
        Agent::start(name, &dir.path().join(name), opts).unwrap()
    };
    let (first, second) = (client("client1"), client("client2"));
    let p = |name: &str| pki.join(name).display().to_string();
    let env_for = |agent: &Agent| {
        vec![
            ("NOMAD_ADDR", format!("https://{}", agent.http_addr)),
            ("NOMAD_CACERT", p("nomad-agent-ca.pem")),
            ("NOMAD_CLIENT_CERT", p("global-cli-nomad.pem")),
            ("NOMAD_CLIENT_KEY", p("global-cli-nomad-key.pem")),
        ]
    };
    // Through the first client-only agent, which forwards the API to its server over https.
    let via_first = env_for(&first);
    wait_for("both nodes ready, listed through a client agent", SETTLE, || {
        let (code, out, _) = run(dir.path(), &["node", "status"], &via_first);
        (code == 0 && out.matches("ready").count() == 2).then_some(())
    })
    .map_err(|e| format!("{e}\n{}\n{}", first.logs(), server.logs()))
    .unwrap();
    let job = dir.path().join("far.nomad.hcl");
    std::fs::write(
        &job,
        "job \"far\" {\n  datacenters = [\"dc1\"]\n  constraint {\n    attribute = \"${node.unique.name}\"\n    value = \"client2\"\n  }\n  \
         group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n      config {\n        command = \"/bin/sleep\"\n        args = [\"300\"]\n      }\n    }\n  }\n}\n",
    )
    .unwrap();
    let (code, out, err) = run(dir.path(), &["job", "run", job.to_str().unwrap()], &via_first);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = run(dir.path(), &["job", "status", "far"], &via_first);
    assert_eq!(code, 0, "{out}\n{err}");
    // The allocations table's first row: its ID prefix.
    let rows: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("Allocations")).skip(2).collect();
    let alloc = rows.first().and_then(|r| r.split_whitespace().next()).unwrap_or_default().to_string();
    assert!(rows.first().is_some_and(|r| r.contains("running")) && alloc.len() == 8, "{out}");
    // `alloc exec` for the alloc on the second client: from the server (relayed to the node over
    // wss) and from the first client (through the server, then the node).
    for (via, agent) in [("the server", &server), ("the first client", &first)] {
        let (code, out, err) =
            run(dir.path(), &["alloc", "exec", "-i=false", "-t=false", &alloc, "/bin/echo", "over-tls"], &env_for(agent));
        assert_eq!((code, out.as_str()), (0, "over-tls\n"), "via {via}: {err}\n{}\n{}", agent.logs(), second.logs());
    }
    let (code, _, err) = run(dir.path(), &["job", "stop", "-purge", "far"], &via_first);
    assert_eq!(code, 0, "{err}");
}
