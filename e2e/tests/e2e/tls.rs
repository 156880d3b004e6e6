//! TLS on the HTTP API against a real dev agent: certificates made by `nomad-rs tls ca|cert
//! create`, `tls { http, verify_https_client }`, the CLI over https with Nomad's environment
//! variables, a client without a certificate refused, plain HTTP answered with Go's 400, and a
//! certificate rotated on disk served after SIGHUP without a restart; mutual TLS on RPC, and its
//! certificate rotated the same way.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

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

/// `tls {}` with mutual TLS on RPC and the role names checked; HTTP stays plaintext.
fn rpc_tls_block(pki: &Path, cert: &str) -> String {
    let p = |name: &str| pki.join(name).display().to_string();
    format!(
        "tls {{\n  rpc = true\n  verify_server_hostname = true\n  ca_file = {:?}\n  cert_file = {:?}\n  key_file = {:?}\n}}\n",
        p("nomad-agent-ca.pem"),
        p(&format!("{cert}.pem")),
        p(&format!("{cert}-key.pem")),
    )
}

#[test]
fn rpc_mutual_tls_with_verify_server_hostname_runs_a_cluster_and_keeps_clients_and_plaintext_out() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    ok(&pki, &["tls", "ca", "create"]);
    for role in ["-server", "-client"] {
        ok(&pki, &["tls", "cert", "create", role]);
    }
    let key = nomad_e2e::cluster::cluster_key().unwrap();
    let ports = nomad_e2e::cluster::reserve_ports(6).unwrap();
    let rpc: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", ports[2 * i + 1])).collect();
    let server_config = |cert: &str, not: Option<usize>| {
        let join: Vec<String> = rpc.iter().enumerate().filter(|(j, _)| Some(*j) != not).map(|(_, a)| format!("{a:?}")).collect();
        format!(
            "server {{\n  enabled = true\n  encrypt = {key:?}\n  bootstrap_expect = 3\n  server_join {{\n    retry_join = [{}]\n  }}\n}}\n{}",
            join.join(", "),
            rpc_tls_block(&pki, cert)
        )
    };
    let servers: Vec<Agent> = (0..3)
        .map(|i| {
            let name = format!("server{}", i + 1);
            let opts = AgentOptions {
                config: Some(server_config("global-server-nomad", Some(i))),
                ports: Some((ports[2 * i], ports[2 * i + 1])),
                ..Default::default()
            };
            Agent::start(&name, &dir.path().join(&name), opts).unwrap()
        })
        .collect();
    let all_logs = |extra: &[&Agent]| servers.iter().chain(extra.iter().copied()).map(Agent::logs).collect::<Vec<_>>().join("\n");

    // Raft over mutual TLS, names checked: one leader.
    wait_for("the three TLS servers to agree on a leader", Duration::from_secs(60), || {
        let leaders: Vec<String> = servers
            .iter()
            .map(|s| s.http().get_json("/v1/status/leader").ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default())
            .collect();
        (!leaders[0].is_empty() && leaders.iter().all(|l| *l == leaders[0])).then_some(())
    })
    .map_err(|e| format!("{e}\n{}", all_logs(&[])))
    .unwrap();

    // A client with a client certificate registers and runs a job (node RPCs allow `client.`).
    let quoted: Vec<String> = rpc.iter().map(|a| format!("{a:?}")).collect();
    let client_config = format!(
        "client {{\n  enabled = true\n  servers = [{}]\n}}\nplugin \"raw_exec\" {{\n  config {{\n    enabled = true\n  }}\n}}\n{}",
        quoted.join(", "),
        rpc_tls_block(&pki, "global-client-nomad")
    );
    let client =
        Agent::start("client1", &dir.path().join("client1"), AgentOptions { config: Some(client_config), ..Default::default() }).unwrap();
    let api = vec![("NOMAD_ADDR", format!("http://{}", servers[0].http_addr))];
    wait_for("the client node ready", SETTLE, || {
        let (code, out, _) = run(dir.path(), &["node", "status"], &api);
        (code == 0 && out.contains("ready")).then_some(())
    })
    .map_err(|e| format!("{e}\n{}", all_logs(&[&client])))
    .unwrap();
    let job = dir.path().join("over-rpc-tls.nomad.hcl");
    std::fs::write(
        &job,
        "job \"rpctls\" {\n  datacenters = [\"dc1\"]\n  group \"g\" {\n    task \"t\" {\n      driver = \"raw_exec\"\n      config {\n        \
         command = \"/bin/sleep\"\n        args = [\"300\"]\n      }\n    }\n  }\n}\n",
    )
    .unwrap();
    let (code, out, err) = run(dir.path(), &["job", "run", "-detach", job.to_str().unwrap()], &api);
    assert_eq!(code, 0, "{out}\n{err}");
    wait_for("the job's alloc running on the TLS client", SETTLE, || {
        let allocs = servers[1].http().get_json("/v1/job/rpctls/allocations").ok()?;
        allocs.as_array()?.iter().any(|a| a["ClientStatus"] == "running").then_some(())
    })
    .map_err(|e| format!("{e}\n{}", all_logs(&[&client])))
    .unwrap();

    // An agent holding the cluster key and a CA-signed *client* certificate, configured as a
    // server: its Raft calls are refused for the certificate, and it never becomes a member.
    let rogue = Agent::start(
        "rogue",
        &dir.path().join("rogue"),
        AgentOptions { config: Some(server_config("global-client-nomad", None)), ..Default::default() },
    )
    .unwrap();
    wait_for("the servers to refuse the rogue's Raft calls", SETTLE, || {
        servers
            .iter()
            .any(|s| {
                s.logs()
                    .lines()
                    .any(|l| l.contains("refused an rpc call") && l.contains("nomad.raft.Raft/") && l.contains("PermissionDenied"))
            })
            .then_some(())
    })
    .map_err(|e| format!("{e}\n{}", all_logs(&[&rogue])))
    .unwrap();
    let members = servers[0].http().get_json("/v1/operator/raft/configuration").unwrap();
    assert_eq!(members["Servers"].as_array().map(Vec::len), Some(3), "{members}");
    assert!(!rogue.logs().contains("joined the raft cluster"), "{}", rogue.logs());

    // Plaintext gRPC (the HTTP/2 preface) on the RPC port: closed without an answer.
    let mut tcp = std::net::TcpStream::connect(&rpc[0]).unwrap();
    tcp.set_read_timeout(Some(SETTLE)).unwrap();
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").unwrap();
    let mut answer = Vec::new();
    let read = tcp.read_to_end(&mut answer);
    assert!(answer.is_empty(), "plaintext got an answer: {answer:?} ({read:?})");

    let (code, _, err) = run(dir.path(), &["job", "stop", "-detach", "-purge", "rpctls"], &api);
    assert_eq!(code, 0, "{err}");
}

/// Whether a TLS handshake with the RPC listener at `addr` succeeds when the client presents
/// the CA-signed client certificate from `pki` and expects `name` on the server's certificate.
fn rpc_handshake(pki: &Path, addr: &str, name: &str) -> Result<(), String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let pem = |f: &str| pki.join(f);
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pem("nomad-agent-ca.pem")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(pem("global-client-nomad.pem")).unwrap().map(Result::unwrap).collect();
    let key = PrivateKeyDer::from_pem_file(pem("global-client-nomad-key.pem")).unwrap();
    // The provider the agent uses too (`ring_provider` in agent/src/tls), deprecated by rustls
    // only for lacking post-quantum key exchange.
    #[allow(deprecated)]
    let provider = rustls::crypto::ring::default_provider();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .unwrap();
    let name = ServerName::try_from(name.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name).map_err(|e| e.to_string())?;
    let mut tcp = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(SETTLE)).unwrap();
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[test]
fn an_rpc_certificate_rotated_on_disk_is_served_after_sighup_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    std::fs::create_dir(&pki).unwrap();
    ok(&pki, &["tls", "ca", "create"]);
    for role in ["-server", "-client"] {
        ok(&pki, &["tls", "cert", "create", role]);
    }
    let config = format!("server {{\n  enabled = true\n  bootstrap_expect = 1\n}}\n{}", rpc_tls_block(&pki, "global-server-nomad"));
    let agent = Agent::start("server1", &dir.path().join("server1"), AgentOptions { config: Some(config), ..Default::default() }).unwrap();
    agent.wait_for_leader(SETTLE).map_err(|e| format!("{e}\n{}", agent.logs())).unwrap();
    rpc_handshake(&pki, &agent.rpc_addr, "server.global.nomad").unwrap();
    let err = rpc_handshake(&pki, &agent.rpc_addr, "rotated.nomad.test").unwrap_err();
    assert!(err.contains("not valid for name \"rotated.nomad.test\""), "the first certificate lacks the new name: {err}");

    // A new server certificate with one more name, written over the old files (beside, then
    // renamed), then SIGHUP.
    let rotated = dir.path().join("rotated");
    std::fs::create_dir(&rotated).unwrap();
    for f in ["nomad-agent-ca.pem", "nomad-agent-ca-key.pem"] {
        std::fs::copy(pki.join(f), rotated.join(f)).unwrap();
    }
    ok(&rotated, &["tls", "cert", "create", "-server", "-additional-dnsname", "rotated.nomad.test"]);
    for f in ["global-server-nomad.pem", "global-server-nomad-key.pem"] {
        let tmp = pki.join(format!("{f}.new"));
        std::fs::copy(rotated.join(f), &tmp).unwrap();
        std::fs::rename(&tmp, pki.join(f)).unwrap();
    }
    let pid = agent.pid().expect("a running agent");
    agent.signal(nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_for("the rotated RPC certificate to be served", SETTLE, || rpc_handshake(&pki, &agent.rpc_addr, "rotated.nomad.test").ok())
        .map_err(|e| format!("{e}\n{}", agent.logs()))
        .unwrap();
    assert_eq!(agent.pid(), Some(pid), "the same process: no restart");
    rpc_handshake(&pki, &agent.rpc_addr, "server.global.nomad").unwrap();
    // Still the leader of its cluster of one, over the new certificate.
    agent.wait_for_leader(SETTLE).map_err(|e| format!("{e}\n{}", agent.logs())).unwrap();
}
