//! A whole Consul Connect mesh through the real path: a dev agent whose `consul {}` points at the
//! Consul stand-in (ACLs on, so the servers derive SI tokens), jobs submitted with the CLI as
//! users write them (`network { mode = "bridge" }`, `connect { sidecar_service {} sidecar_task
//! { driver = "exec" ... envoy } }`), the servers' mutator injecting the Envoy tasks, the
//! client's CNI bridge namespaces, its Consul registrations, its native Envoy bootstrap and the
//! `consul_grpc.sock` proxy, and real Envoys taking their configuration from the stand-in's
//! xDS.
//!
//! - `count-api` (busybox httpd on 127.0.0.1:9001 in its namespace) and `count-dashboard`
//!   (busybox httpd whose CGI fetches `${NOMAD_UPSTREAM_ADDR_count_api}`): the dashboard reaches
//!   the API through its upstream's local port, through both Envoys over mTLS (each Envoy's
//!   admin stats count it); TLS to the API's sidecar without a mesh certificate is refused; the
//!   API's own port is not reachable from the host; one SI token per Connect task, revoked at
//!   stop; an agent `kill -9` and restart keeps the namespaces, the tasks and the Envoys (same
//!   PIDs); stopping leaves no namespace, veth, lease or netfilter rule.
//! - A terminating gateway job (its config entry written by the servers at register) lets the
//!   dashboard reach an HTTP server outside the mesh.
//! - An Envoy that cannot start fails its task (exit code, no restart) and its alloc; Envoy's
//!   reason is in the task's stderr.
//! - The default injection with docker: Envoy as a docker task of a locally imported image
//!   named as `connect.sidecar_image` resolves for the stand-in's Envoy version, beside the
//!   docker driver's infra container.
//! - `examples/connect.nomad.hcl` through `job run`.
//!
//! Every test has its own bridge and subnet (the `bridge_network_*` client knobs), and its agent
//! runs with `-dev-connect`, which makes the default route's interface the node's: a sidecar's
//! registered address must be reachable from inside the other namespaces, which loopback is not.

use std::cell::RefCell;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nomad_e2e::consul::{ConsulOptions, ConsulStandIn};
use nomad_e2e::{Agent, AgentOptions, HttpClient, wait_for};
use nomad_testkit::Prereq;
use nomad_testkit::prereq::envoy_binary;
use serde_json::{Value, json};

use crate::SETTLE;
use crate::bridge::{bridge_ports, cleanup_alloc_network, cleanup_bridge, inode, iptables_save, leases_of, rules_with, task_pid};
use crate::cli::nomad;

/// The stand-in's management token: the agent's `consul { token }`.
const MANAGEMENT: &str = "5d1b0c7e-connect-mesh-management";
/// How long a mesh may take to carry its first request (Consul's listening check runs every
/// 10 s and a sidecar without a passing one gets no traffic).
const MESH: Duration = Duration::from_secs(60);
/// The API's port inside its namespace.
const API_PORT: u16 = 9001;
/// The dashboard's port inside its namespace.
const DASHBOARD_PORT: u16 = 9002;

/// The default route's interface and its IPv4 address.
pub(crate) fn default_route_address() -> (String, String) {
    let route = Command::new("ip").args(["-o", "-4", "route", "show", "default"]).output().expect("ip route");
    let route = String::from_utf8_lossy(&route.stdout);
    let dev = route.split_whitespace().skip_while(|w| *w != "dev").nth(1).expect("a default route").to_string();
    let addr = Command::new("ip").args(["-o", "-4", "addr", "show", "dev", &dev]).output().expect("ip addr");
    let addr = String::from_utf8_lossy(&addr.stdout);
    let ip = addr.split_whitespace().skip_while(|w| *w != "inet").nth(1).and_then(|c| c.split('/').next()).expect("an address");
    (dev, ip.to_string())
}

/// The Envoy an exec task can run: the exec chroot binds the host's `/usr`, where
/// `scripts/install-deps` puts it.
pub(crate) fn envoy_for_exec() -> String {
    let under_usr = |p: &Path| p.starts_with("/usr") && p.is_file();
    match envoy_binary().filter(|p| under_usr(p)) {
        Some(p) => p.display().to_string(),
        None if under_usr(Path::new("/usr/local/bin/envoy")) => "/usr/local/bin/envoy".into(),
        None => panic!("no Envoy under /usr for the exec driver's chroot: scripts/install-deps copies it to /usr/local/bin/envoy"),
    }
}

/// A test's bridge, subnet and the allocs whose networks are removed whatever happens.
pub(crate) struct Network {
    pub(crate) bridge: String,
    pub(crate) subnet: String,
    allocs: RefCell<Vec<(String, Option<String>)>>,
}

impl Network {
    /// The `index`th network of this process (each test its own).
    pub(crate) fn new(index: u32) -> Network {
        let pid = std::process::id();
        Network {
            bridge: format!("nrsm{index}{}", pid % 100_000),
            subnet: format!("10.{}.{}.0/24", 100 + index * 10 + (pid / 256) % 10, pid % 256),
            allocs: RefCell::new(Vec::new()),
        }
    }

    pub(crate) fn track(&self, alloc: &Value) {
        let id = alloc["ID"].as_str().unwrap_or_default().to_string();
        let address = alloc["NetworkStatus"]["Address"].as_str().map(str::to_string);
        let mut allocs = self.allocs.borrow_mut();
        allocs.retain(|(a, _)| *a != id);
        allocs.push((id, address));
    }
}

impl Drop for Mesh {
    /// Every alloc the agent made is cleaned up, also those a failed test never looked at.
    fn drop(&mut self) {
        let _ = self.agent.kill9();
        for entry in std::fs::read_dir(self.agent.data_dir().join("alloc")).into_iter().flatten().flatten() {
            let id = entry.file_name().to_string_lossy().into_owned();
            if !self.net.allocs.borrow().iter().any(|(a, _)| *a == id) {
                self.net.allocs.borrow_mut().push((id, None));
            }
        }
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        for (id, address) in self.allocs.borrow().iter() {
            cleanup_alloc_network(id, address.as_deref());
        }
        cleanup_bridge(&self.bridge, &self.subnet);
    }
}

/// A dev agent on the stand-in, with its own bridge. Fields drop in order: the agent (and its
/// tasks) first, then the networks they used.
pub(crate) struct Mesh {
    pub(crate) agent: Agent,
    pub(crate) net: Network,
    pub(crate) consul: ConsulStandIn,
    pub(crate) host_ip: String,
    pub(crate) dir: tempfile::TempDir,
}

impl Mesh {
    /// `extra` is appended to the agent's configuration.
    pub(crate) fn start(index: u32, extra: &str) -> Mesh {
        Mesh::start_with(index, ConsulOptions::default(), extra)
    }

    /// With the stand-in started from `consul` (its xDS and ACLs turned on).
    pub(crate) fn start_with(index: u32, consul: ConsulOptions, extra: &str) -> Mesh {
        let opts = ConsulOptions { grpc_port: 0, management_token: Some(MANAGEMENT.into()), ..consul };
        let consul = ConsulStandIn::start(opts).expect("start the consul stand-in");
        let net = Network::new(index);
        let (_, host_ip) = default_route_address();
        let dir = tempfile::tempdir().unwrap();
        let config = format!(
            "client {{\n  bridge_network_name = \"{}\"\n  bridge_network_subnet = \"{}\"\n}}\n\
             consul {{\n  address = \"{}\"\n  token = \"{MANAGEMENT}\"\n}}\n{extra}",
            net.bridge,
            net.subnet,
            consul.addr()
        );
        let opts = AgentOptions {
            args: vec!["-dev-connect".into(), "-log-level".into(), "INFO".into()],
            config: Some(config),
            ..Default::default()
        };
        let agent = Agent::start("dev", &dir.path().join("agent"), opts).expect("start the dev agent");
        agent.wait_for_leader(SETTLE).unwrap();
        let http = agent.http();
        let node = wait_for("the dev node to be ready with Consul's gRPC port and bridge networking", SETTLE, || {
            let nodes = http.get_json("/v1/nodes").ok()?;
            let id = nodes.as_array()?.iter().find(|n| n["Status"] == "ready")?["ID"].as_str()?.to_string();
            let node = http.get_json(&format!("/v1/node/{id}")).ok()?;
            let attrs = &node["Attributes"];
            (attrs["consul.grpc"].is_string() && attrs["nomad.bridge.hairpin_mode"].is_string()).then_some(node)
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.logs()));
        assert_eq!(node["Attributes"]["unique.network.ip-address"], host_ip.as_str(), "-dev-connect: the default route's address");
        Mesh { agent, net, consul, host_ip, dir }
    }

    /// `job run -detach` of `hcl`, written to a file as a user would.
    pub(crate) fn run(&self, name: &str, hcl: &str) {
        let file = self.dir.path().join(format!("{name}.nomad.hcl"));
        std::fs::write(&file, hcl).unwrap();
        nomad(&self.agent, &["job", "run", "-detach", file.to_str().unwrap()]).expect(0, &format!("job run {name}"));
    }

    /// The job's one alloc once every task of it runs (tracked for cleanup).
    pub(crate) fn running(&self, job: &str) -> Value {
        let http = self.agent.http();
        let alloc = wait_for(&format!("every task of {job} to run"), SETTLE * 2, || {
            let list = http.get_json(&format!("/v1/job/{job}/allocations")).ok()?;
            let id = list.as_array()?.first()?["ID"].as_str()?.to_string();
            let alloc = http.get_json(&format!("/v1/allocation/{id}")).ok()?;
            if alloc["NetworkStatus"]["Address"].is_string() {
                self.net.track(&alloc);
            }
            let states = alloc["TaskStates"].as_object()?;
            let tasks = alloc["Job"]["TaskGroups"][0]["Tasks"].as_array()?.len();
            (alloc["ClientStatus"] == "failed" || (states.len() == tasks && states.values().all(|s| s["State"] == "running")))
                .then_some(alloc)
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", self.agent.logs()));
        assert_eq!(alloc["ClientStatus"], "running", "{job}: {:#}\n{}", alloc["TaskStates"], self.agent.logs());
        alloc
    }

    /// A file of an alloc's task dir.
    pub(crate) fn task_file(&self, alloc_id: &str, task: &str, rel: &str) -> PathBuf {
        self.agent.data_dir().join("alloc").join(alloc_id).join(task).join(rel)
    }

    /// The stand-in's HTTP API.
    pub(crate) fn consul_http(&self) -> HttpClient {
        HttpClient::new(&self.consul.addr().to_string())
    }

    /// The Envoy admin address a sidecar's bootstrap names (inside its alloc's namespace).
    pub(crate) fn envoy_admin(&self, alloc_id: &str, task: &str) -> String {
        let path = self.task_file(alloc_id, task, "secrets/envoy_bootstrap.json");
        let bootstrap: Value = serde_json::from_slice(&std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap();
        let sa = &bootstrap["admin"]["address"]["socket_address"];
        format!("{}:{}", sa["address"].as_str().unwrap(), sa["port_value"])
    }
}

/// `GET http://<addr><path>` from inside the alloc's network namespace, entered through its
/// Envoy's (exec tasks share `/var/run/netns/<alloc>`, docker tasks the infra container's);
/// busybox wget, whose `-T` crashes Debian's 1.35.
pub(crate) fn get_in_netns(alloc_id: &str, addr: &str, path: &str) -> String {
    let Some(pid) = task_pid(alloc_id, "envoy") else { return String::new() };
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args(["/bin/busybox", "wget", "-q", "-O", "-"])
        .arg(format!("http://{addr}{path}"))
        .output()
        .expect("nsenter");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The sum of the Envoy's counters whose name contains every one of `parts`.
pub(crate) fn envoy_stat(alloc_id: &str, admin: &str, parts: &[&str]) -> u64 {
    get_in_netns(alloc_id, admin, "/stats")
        .lines()
        .filter(|l| parts.iter().all(|p| l.contains(p)))
        .filter_map(|l| l.rsplit_once(": ").and_then(|(_, v)| v.trim().parse::<u64>().ok()))
        .sum()
}

/// One HTTP/1.0 GET to `addr`; the whole response, or `None` when nothing answers.
pub(crate) fn http_get(addr: &str, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr.parse().ok()?, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(8))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    Some(String::from_utf8_lossy(&reply).into_owned())
}

/// An allocated port of the alloc: (host value, value inside the namespace).
pub(crate) fn alloc_port(alloc: &Value, label: &str) -> (u16, u16) {
    let ports = alloc["AllocatedResources"]["Shared"]["Ports"].as_array().cloned().unwrap_or_default();
    let p = ports.iter().find(|p| p["Label"] == label).unwrap_or_else(|| panic!("no port {label}: {ports:?}"));
    let value = p["Value"].as_u64().unwrap() as u16;
    let to = p["To"].as_i64().filter(|t| *t > 0).map(|t| t as u16).unwrap_or(value);
    (value, to)
}

/// The `sidecar_task` that runs the host's Envoy under exec (README's form), with `extra_args`.
pub(crate) fn exec_sidecar_task(envoy: &str, extra_args: &str) -> String {
    format!(
        r#"        sidecar_task {{
          driver = "exec"
          config {{
            command = "{envoy}"
            args    = ["-c", "${{NOMAD_SECRETS_DIR}}/envoy_bootstrap.json", "-l", "${{meta.connect.log_level}}",
                       "--concurrency", "${{meta.connect.proxy_concurrency}}", "--disable-hot-restart"{extra_args}]
          }}
        }}
"#
    )
}

/// The API: busybox httpd on 127.0.0.1:9001 inside its namespace, answering with its alloc ID.
pub(crate) fn api_job(sidecar_task: &str, driver: &str) -> String {
    let (command, prefix) = api_command(driver);
    format!(
        r#"job "count-api" {{
  datacenters = ["dc1"]

  group "api" {{
    network {{
      mode = "bridge"
    }}

    restart {{
      attempts = 0
      mode     = "fail"
    }}

    service {{
      name = "count-api"
      port = "{API_PORT}"

      connect {{
        sidecar_service {{}}
{sidecar_task}      }}
    }}

    task "api" {{
      driver = "{driver}"

      config {{
{prefix}        command = "/bin/sh"
        args    = ["-c", "{command}"]
      }}

      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"#
    )
}

/// The API's shell command and, for docker, its image line.
fn api_command(driver: &str) -> (String, String) {
    let command = format!(
        "mkdir -p $NOMAD_TASK_DIR/www && echo count-api-$NOMAD_ALLOC_ID > $NOMAD_TASK_DIR/www/index.html && \
         exec /bin/busybox httpd -f -p 127.0.0.1:{API_PORT} -h $NOMAD_TASK_DIR/www"
    );
    let prefix =
        if driver == "docker" { format!("        image   = \"{}\"\n", nomad_testkit::docker::busybox_image()) } else { String::new() };
    (command, prefix)
}

/// The dashboard: busybox httpd on its `http` port whose CGI `/cgi-bin/<upstream>` fetches
/// `http://${NOMAD_UPSTREAM_ADDR_<upstream>}/` for each upstream (name, local bind port).
pub(crate) fn dashboard_job(sidecar_task: &str, upstreams: &[(&str, u16)]) -> String {
    let blocks: String = upstreams
        .iter()
        .map(|(name, port)| {
            format!("            upstreams {{\n              destination_name = \"{name}\"\n              local_bind_port  = {port}\n            }}\n")
        })
        .collect();
    let cleaned: Vec<String> = upstreams.iter().map(|(n, _)| n.replace('-', "_")).collect();
    let script = format!(
        "mkdir -p $NOMAD_TASK_DIR/www/cgi-bin && for u in {}; do eval addr=\\\\$NOMAD_UPSTREAM_ADDR_$u; \
         printf '#!/bin/sh\\\\necho Content-Type: text/plain\\\\necho\\\\nexec /bin/busybox wget -q -O - http://%s/\\\\n' \
         $addr > $NOMAD_TASK_DIR/www/cgi-bin/$u; chmod 755 $NOMAD_TASK_DIR/www/cgi-bin/$u; done && \
         exec /bin/busybox httpd -f -p {DASHBOARD_PORT} -h $NOMAD_TASK_DIR/www",
        cleaned.join(" ")
    );
    format!(
        r#"job "count-dashboard" {{
  datacenters = ["dc1"]

  group "dashboard" {{
    network {{
      mode = "bridge"

      port "http" {{
        to = {DASHBOARD_PORT}
      }}
    }}

    service {{
      name = "count-dashboard"
      port = "{DASHBOARD_PORT}"

      connect {{
        sidecar_service {{
          proxy {{
{blocks}          }}
        }}
{sidecar_task}      }}
    }}

    task "dashboard" {{
      driver = "exec"

      config {{
        command = "/bin/sh"
        args    = ["-c", "{script}"]
      }}

      resources {{
        cpu    = 50
        memory = 32
      }}
    }}
  }}
}}
"#
    )
}

/// What the dashboard's CGI for `upstream` returns, once it contains `marker`.
pub(crate) fn through_dashboard(mesh: &Mesh, dashboard: &Value, upstream: &str, marker: &str) -> String {
    let (port, _) = alloc_port(dashboard, "http");
    let addr = format!("{}:{port}", mesh.host_ip);
    let path = format!("/cgi-bin/{}", upstream.replace('-', "_"));
    let mut last = None;
    wait_for(&format!("the dashboard to reach {upstream} through the mesh"), MESH, || {
        last = http_get(&addr, &path);
        last.clone().filter(|r| r.contains(marker))
    })
    .unwrap_or_else(|e| panic!("{e}; last reply {last:?}\n{}", mesh.agent.logs()))
}

/// `openssl s_client` to `addr` without a client certificate: what came back.
fn tls_without_mesh_certificate(addr: &str, sni: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", addr, "-servername", sni, "-quiet"])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    let _ = child.stdin.take().unwrap().write_all(b"GET / HTTP/1.0\r\n\r\n");
    let done = wait_for("openssl s_client to end", SETTLE, || child.try_wait().ok().flatten());
    if done.is_err() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The SI token in a task's `secrets/si_token`.
fn si_token(mesh: &Mesh, alloc_id: &str, task: &str) -> String {
    let path = mesh.task_file(alloc_id, task, "secrets/si_token");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().to_string()
}

/// What the stand-in says of an ACL token (`/v1/acl/token/self`), by its secret.
fn token_self(mesh: &Mesh, secret: &str) -> (u16, Value) {
    let r = mesh.consul_http().request("GET", &format!("/v1/acl/token/self?token={secret}"), None).unwrap();
    (r.status, r.json().unwrap_or(Value::Null))
}

#[test]
fn count_api_and_dashboard_talk_through_two_envoys_over_mtls_survive_an_agent_kill_and_leave_nothing_behind() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Iproute2, Prereq::CniPlugins, Prereq::Envoy, Prereq::Busybox, Prereq::Runc);
    let envoy = envoy_for_exec();
    let mut mesh = Mesh::start(0, "");
    let td = mesh.consul.ca().unwrap().trust_domain.clone();

    mesh.run("api", &api_job(&exec_sidecar_task(&envoy, ""), "exec"));
    mesh.run("dashboard", &dashboard_job(&exec_sidecar_task(&envoy, ""), &[("count-api", 8080)]));
    let api = mesh.running("count-api");
    let dashboard = mesh.running("count-dashboard");
    let (api_id, dash_id) = (api["ID"].as_str().unwrap().to_string(), dashboard["ID"].as_str().unwrap().to_string());
    let api_address = api["NetworkStatus"]["Address"].as_str().unwrap().to_string();
    let tasks: Vec<&str> = api["Job"]["TaskGroups"][0]["Tasks"].as_array().unwrap().iter().filter_map(|t| t["Name"].as_str()).collect();
    assert_eq!(tasks, ["api", "connect-proxy-count-api"], "the servers injected the sidecar");

    // The dashboard reaches the API through `localhost:8080`, its upstream's local listener.
    let marker = format!("count-api-{api_id}");
    let reply = through_dashboard(&mesh, &dashboard, "count-api", &marker);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");

    // Through both Envoys, over mTLS: the dashboard's upstream cluster and the API's public
    // listener each did a TLS handshake, and the API's local_app cluster was used.
    let (dash_admin, api_admin) =
        (mesh.envoy_admin(&dash_id, "connect-proxy-count-dashboard"), mesh.envoy_admin(&api_id, "connect-proxy-count-api"));
    let api_cluster = format!("cluster.count-api.default.dc1.internal.{td}.");
    let (public_host, public_in_ns) = alloc_port(&api, "connect-proxy-count-api");
    let public_listener = format!("listener.0.0.0.0_{public_in_ns}.");
    assert!(envoy_stat(&dash_id, &dash_admin, &[&api_cluster, "ssl.handshake"]) >= 1, "{}", get_in_netns(&dash_id, &dash_admin, "/stats"));
    assert!(envoy_stat(&dash_id, &dash_admin, &[&api_cluster, "upstream_cx_total"]) >= 1);
    assert!(envoy_stat(&api_id, &api_admin, &[&public_listener, "ssl.handshake"]) >= 1, "{}", get_in_netns(&api_id, &api_admin, "/stats"));
    assert!(envoy_stat(&api_id, &api_admin, &["cluster.local_app.upstream_cx_total"]) >= 1);
    assert!(mesh.consul.xds_nacks().is_empty(), "{:?}", mesh.consul.xds_nacks());

    // TLS to the API's sidecar without a mesh certificate: refused, the API never answers.
    let public = format!("{}:{public_host}", mesh.host_ip);
    let plain = http_get(&public, "/").unwrap_or_default();
    assert!(!plain.contains(&marker), "plain TCP reached the API: {plain}");
    let tls = tls_without_mesh_certificate(&public, &format!("count-api.default.dc1.internal.{td}"));
    assert!(!tls.contains(&marker), "TLS without a client certificate reached the API: {tls}");
    wait_for("the API's Envoy to count the missing client certificate", SETTLE, || {
        (envoy_stat(&api_id, &api_admin, &[&public_listener, "ssl.fail_verify_no_cert"]) >= 1).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {tls}\n{}", get_in_netns(&api_id, &api_admin, "/stats?filter=ssl")));

    // The API's own port is not reachable from the host: not on the host, not on its address.
    for addr in [format!("{}:{API_PORT}", mesh.host_ip), format!("{api_address}:{API_PORT}")] {
        assert!(http_get(&addr, "/").is_none_or(|r| !r.contains(&marker)), "{addr} reached the API");
    }

    // One SI token per Connect task, for its service, and none for the others.
    let tokens: Vec<(String, &str)> = vec![
        (si_token(&mesh, &api_id, "connect-proxy-count-api"), "count-api"),
        (si_token(&mesh, &dash_id, "connect-proxy-count-dashboard"), "count-dashboard"),
    ];
    assert!(!mesh.task_file(&api_id, "api", "secrets/si_token").exists());
    assert!(!mesh.task_file(&dash_id, "dashboard", "secrets/si_token").exists());
    let mut accessors = Vec::new();
    for (secret, service) in &tokens {
        let (status, token) = token_self(&mesh, secret);
        assert_eq!(status, 200, "{service}'s SI token resolves: {token}");
        assert_eq!(token["ServiceIdentities"][0]["ServiceName"], *service, "{token}");
        accessors.push(token["AccessorID"].as_str().unwrap().to_string());
    }
    assert_eq!(mesh.consul.calls_to("PUT", "/v1/acl/token").len(), 2, "one SI token derived per Connect task");

    // kill -9 and restart: the namespaces, the tasks and the Envoys stay, with the same PIDs.
    let pids = |id: &str, comm: &str| task_pid(id, comm).unwrap_or_else(|| panic!("no {comm} of {id}"));
    let before = [pids(&api_id, "envoy"), pids(&api_id, "busybox"), pids(&dash_id, "envoy"), pids(&dash_id, "busybox")];
    let netns = |id: &str| inode(&Path::new("/var/run/netns").join(id));
    let namespaces = [netns(&api_id), netns(&dash_id)];
    mesh.agent.kill9().unwrap();
    mesh.agent.restart().unwrap();
    mesh.agent.wait_for_leader(SETTLE).unwrap();
    let http = mesh.agent.http();
    for (id, task) in [(&api_id, "connect-proxy-count-api"), (&dash_id, "connect-proxy-count-dashboard")] {
        wait_for("the restored agent to reattach to the Envoys", SETTLE, || {
            let stats = http.get_json(&format!("/v1/client/allocation/{id}/stats")).ok()?;
            stats["Tasks"].get(task).map(drop)
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", mesh.agent.logs()));
    }
    let after = [pids(&api_id, "envoy"), pids(&api_id, "busybox"), pids(&dash_id, "envoy"), pids(&dash_id, "busybox")];
    assert_eq!(before, after, "the same Envoys and tasks");
    assert_eq!(namespaces, [netns(&api_id), netns(&dash_id)], "the same namespaces");
    let adds =
        |logs: &str, id: &str| logs.lines().filter(|l| l.contains("configured the alloc's network namespace") && l.contains(id)).count();
    let logs = mesh.agent.logs();
    assert_eq!((adds(&logs, &api_id), adds(&logs, &dash_id)), (1, 1), "no second CNI ADD");
    let reply = through_dashboard(&mesh, &dashboard, "count-api", &marker);
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert_eq!(mesh.consul.calls_to("PUT", "/v1/acl/token").len(), 2, "the restored tasks keep their SI tokens");

    // Stop: no namespace, veth, lease or rule left; the SI tokens revoked.
    assert_eq!(bridge_ports(&mesh.net.bridge).len(), 2, "one veth per alloc");
    nomad(&mesh.agent, &["job", "stop", "count-dashboard"]).expect(0, "job stop count-dashboard");
    nomad(&mesh.agent, &["job", "stop", "count-api"]).expect(0, "job stop count-api");
    for id in [&api_id, &dash_id] {
        let ns = Path::new("/var/run/netns").join(id);
        wait_for("the namespace to go", SETTLE, || (!ns.exists()).then_some(())).unwrap_or_else(|e| panic!("{e}\n{}", mesh.agent.logs()));
        assert!(task_pid(id, "envoy").is_none(), "no Envoy of {id} left");
        assert_eq!(leases_of(id), Vec::<PathBuf>::new(), "no lease of {id} left");
        assert_eq!(rules_with(id), Vec::<String>::new(), "no rule naming {id} left");
    }
    let dash_address = dashboard["NetworkStatus"]["Address"].as_str().unwrap();
    for address in [&api_address, dash_address] {
        assert_eq!(rules_with(&format!("{address}/32")), Vec::<String>::new(), "no rule naming {address}\n{}", iptables_save());
    }
    assert_eq!(bridge_ports(&mesh.net.bridge), Vec::<String>::new(), "no veth left");
    wait_for("both SI tokens to be revoked", SETTLE, || {
        let deleted = mesh.consul.calls_to("DELETE", "/v1/acl/token/");
        accessors.iter().all(|a| deleted.iter().any(|c| c.path.ends_with(a.as_str()))).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}", mesh.consul.calls_to("DELETE", "/v1/acl/token/")));
    for (secret, service) in &tokens {
        assert_eq!(token_self(&mesh, secret).0, 403, "{service}'s SI token no longer resolves");
    }
    assert!(!mesh.agent.logs().contains("resources may have leaked"), "{}", mesh.agent.logs());
}

/// A plain HTTP server outside the mesh on `ip`; its port.
fn outside_server(ip: &str, body: &'static str) -> u16 {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                    line.clear();
                }
                let mut s = s;
                let _ = write!(s, "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
            });
        }
    });
    port
}

#[test]
fn a_terminating_gateway_job_lets_a_mesh_task_reach_an_http_server_outside_the_mesh() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Iproute2, Prereq::CniPlugins, Prereq::Envoy, Prereq::Busybox, Prereq::Runc);
    let envoy = envoy_for_exec();
    let mesh = Mesh::start(1, "");
    let td = mesh.consul.ca().unwrap().trust_domain.clone();

    // The service outside the mesh, registered in Consul as an operator would.
    let port = outside_server(&mesh.host_ip, "outside-the-mesh");
    let reg = json!({"Name": "legacy", "ID": "legacy-1", "Address": mesh.host_ip, "Port": port});
    let r = mesh
        .consul_http()
        .request("PUT", &format!("/v1/agent/service/register?token={MANAGEMENT}"), Some(reg.to_string().as_bytes()))
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());

    let gateway = format!(
        r#"job "legacy-gateway" {{
  datacenters = ["dc1"]

  group "gateway" {{
    network {{
      mode = "bridge"
    }}

    service {{
      name = "legacy-gateway"

      connect {{
        gateway {{
          terminating {{
            service {{
              name = "legacy"
            }}
          }}
        }}
{}      }}
    }}
  }}
}}
"#,
        exec_sidecar_task(&envoy, "")
    );
    mesh.run("gateway", &gateway);
    // The servers wrote the gateway's config entry at register.
    let entries: Vec<Value> = mesh.consul.calls_to("PUT", "/v1/config").iter().map(|c| c.json()).collect();
    assert!(
        entries.iter().any(|e| e["Kind"] == "terminating-gateway" && e["Name"] == "legacy-gateway" && e["Services"][0]["Name"] == "legacy"),
        "{entries:?}"
    );
    mesh.run("dashboard", &dashboard_job(&exec_sidecar_task(&envoy, ""), &[("legacy", 8081)]));
    let gw = mesh.running("legacy-gateway");
    let dashboard = mesh.running("count-dashboard");
    let tasks: Vec<&str> = gw["Job"]["TaskGroups"][0]["Tasks"].as_array().unwrap().iter().filter_map(|t| t["Name"].as_str()).collect();
    assert_eq!(tasks, ["connect-terminating-legacy-gateway"]);

    let reply = through_dashboard(&mesh, &dashboard, "legacy", "outside-the-mesh");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // The gateway terminated the dashboard's mTLS for `legacy` and sent plain HTTP on.
    let gw_id = gw["ID"].as_str().unwrap();
    let admin = mesh.envoy_admin(gw_id, "connect-terminating-legacy-gateway");
    let (_, gw_port) = alloc_port(&gw, "connect-terminating-legacy-gateway");
    let stats = get_in_netns(gw_id, &admin, "/stats");
    assert!(envoy_stat(gw_id, &admin, &[&format!("listener.0.0.0.0_{gw_port}."), "ssl.handshake"]) >= 1, "{stats}");
    assert!(envoy_stat(gw_id, &admin, &[&format!("cluster.legacy.default.dc1.internal.{td}."), "upstream_cx_total"]) >= 1, "{stats}");
    assert!(mesh.consul.xds_nacks().is_empty(), "{:?}", mesh.consul.xds_nacks());
}

#[test]
fn an_envoy_that_cannot_start_fails_its_task_with_an_event_saying_so() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Iproute2, Prereq::CniPlugins, Prereq::Envoy, Prereq::Busybox, Prereq::Runc);
    let envoy = envoy_for_exec();
    let mesh = Mesh::start(2, "");
    // A typo in the sidecar_task's arguments: Envoy refuses to start.
    mesh.run("api", &api_job(&exec_sidecar_task(&envoy, ", \"--concurency-typo\", \"1\""), "exec"));
    let http = mesh.agent.http();
    // Failed, and the sidecar's exit recorded: the last of the client's updates may reach the
    // servers a sync after the one that made the alloc failed.
    let last = std::cell::RefCell::new(Value::Null);
    let alloc = wait_for("the alloc to fail with its sidecar's exit recorded", SETTLE * 2, || {
        let list = http.get_json("/v1/job/count-api/allocations").ok()?;
        let id = list.as_array()?.first()?["ID"].as_str()?.to_string();
        let alloc = http.get_json(&format!("/v1/allocation/{id}")).ok()?;
        if alloc["NetworkStatus"]["Address"].is_string() {
            mesh.net.track(&alloc);
        }
        *last.borrow_mut() = alloc.clone();
        let events = alloc["TaskStates"]["connect-proxy-count-api"]["Events"].as_array()?;
        (alloc["ClientStatus"] == "failed" && events.iter().any(|e| e["Type"] == "Not Restarting")).then_some(alloc)
    })
    .unwrap_or_else(|e| panic!("{e}\n{:#}\n{}", last.borrow(), mesh.agent.logs()));
    let sidecar = &alloc["TaskStates"]["connect-proxy-count-api"];
    assert_eq!(sidecar["State"], "dead", "{sidecar:#}");
    assert_eq!(sidecar["Failed"], true, "{sidecar:#}");
    let events = sidecar["Events"].as_array().unwrap();
    let terminated = events.iter().find(|e| e["Type"] == "Terminated").unwrap_or_else(|| panic!("{events:#?}"));
    assert_ne!(terminated["ExitCode"], 0, "{terminated:#}");
    assert!(events.iter().any(|e| e["Type"] == "Not Restarting" && e["FailsTask"] == true), "{events:#?}");
    // The API does not run without its sidecar: killed, naming the sidecar.
    let api = &alloc["TaskStates"]["api"];
    let api_events = api["Events"].as_array().unwrap();
    assert!(
        api_events
            .iter()
            .any(|e| e["DisplayMessage"].as_str().is_some_and(|m| m.contains("connect-proxy-count-api") && m.contains("failed"))),
        "{api_events:#?}"
    );
    let id = alloc["ID"].as_str().unwrap();
    let logs = nomad(&mesh.agent, &["alloc", "logs", "-stderr", "-task", "connect-proxy-count-api", id]);
    assert!(logs.stdout.contains("concurency-typo"), "Envoy says why: {}\n{}", logs.stdout, logs.stderr);
}

/// The version `envoy --version` reports (`<path>  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL`).
fn envoy_version(envoy: &Path) -> String {
    let out = Command::new(envoy).arg("--version").output().expect("envoy --version");
    let text = String::from_utf8_lossy(&out.stdout);
    let build = text.split("version: ").nth(1).unwrap_or_default();
    build.split('/').nth(1).filter(|v| v.split('.').all(|n| n.parse::<u32>().is_ok())).unwrap_or_else(|| panic!("{text}")).to_string()
}

#[test]
fn the_default_injection_runs_envoy_as_a_docker_task_in_the_infra_containers_namespace() {
    nomad_testkit::require_prereqs!(
        Prereq::Root,
        Prereq::Iproute2,
        Prereq::CniPlugins,
        Prereq::Envoy,
        Prereq::Busybox,
        Prereq::Runc,
        Prereq::Docker
    );
    let envoy = envoy_for_exec();
    // The stand-in prefers the host Envoy's version, and the image the default
    // `connect.sidecar_image` names for it holds that Envoy.
    let version = envoy_version(Path::new(&envoy));
    let image = nomad_testkit::docker::envoy_image(Path::new(&envoy), &version).unwrap();
    let pause = nomad_testkit::docker::pause_image();
    nomad_testkit::docker::busybox_image();
    let mesh = Mesh::start_with(
        3,
        ConsulOptions { supported_envoy: vec![version.clone()], ..Default::default() },
        &format!("plugin \"docker\" {{\n  config {{\n    infra_image = \"{pause}\"\n  }}\n}}\n"),
    );
    let mut containers = (crate::docker_bridge::Containers(None), crate::docker_bridge::Containers(None));

    // No sidecar_task: the servers inject a docker Envoy of `${meta.connect.sidecar_image}`.
    mesh.run("api", &api_job("", "docker"));
    mesh.run("dashboard", &dashboard_job(&exec_sidecar_task(&envoy, ""), &[("count-api", 8080)]));
    let api = mesh.running("count-api");
    let dashboard = mesh.running("count-dashboard");
    let api_id = api["ID"].as_str().unwrap().to_string();
    containers.0.0 = Some(api_id.clone());
    let sidecar = api["Job"]["TaskGroups"][0]["Tasks"].as_array().unwrap().iter().find(|t| t["Name"] == "connect-proxy-count-api").cloned();
    let sidecar = sidecar.unwrap_or_else(|| panic!("no sidecar injected: {:#}", api["Job"]));
    assert_eq!(sidecar["Driver"], "docker");
    assert_eq!(sidecar["Config"]["image"], "${meta.connect.sidecar_image}");

    // The infra container, the API and Envoy: the Envoy container is of the resolved image and
    // shares the infra container's namespace.
    let ids = crate::docker_bridge::containers_of(&api_id);
    assert_eq!(ids.len(), 3, "infra, api and Envoy containers: {ids:?}");
    let inspect = |id: &str, format: &str| crate::docker_bridge::docker(&["inspect", "--format", format, id]);
    let infra = ids.iter().find(|id| inspect(id, "{{.Name}}") == format!("/nomad_init_{api_id}")).expect("the infra container").clone();
    let envoy_container = ids
        .iter()
        .find(|id| inspect(id, "{{.Name}}").starts_with("/connect-proxy-count-api-"))
        .unwrap_or_else(|| panic!("no Envoy container among {ids:?}"))
        .clone();
    assert_eq!(inspect(&envoy_container, "{{.Config.Image}}"), image);
    assert_eq!(inspect(&envoy_container, "{{.HostConfig.NetworkMode}}"), format!("container:{infra}"));
    assert_eq!(inspect(&infra, "{{.Config.Image}}"), pause);

    let marker = format!("count-api-{api_id}");
    through_dashboard(&mesh, &dashboard, "count-api", &marker);
    let admin = mesh.envoy_admin(&api_id, "connect-proxy-count-api");
    let (_, public_in_ns) = alloc_port(&api, "connect-proxy-count-api");
    let stats = get_in_netns(&api_id, &admin, "/stats");
    assert!(envoy_stat(&api_id, &admin, &[&format!("listener.0.0.0.0_{public_in_ns}."), "ssl.handshake"]) >= 1, "{stats}");
    assert!(mesh.consul.xds_nacks().is_empty(), "{:?}", mesh.consul.xds_nacks());

    // Stop: the containers go with the alloc, and so does its network.
    let api_address = api["NetworkStatus"]["Address"].as_str().unwrap().to_string();
    nomad(&mesh.agent, &["job", "stop", "count-api"]).expect(0, "job stop count-api");
    wait_for("the API's containers to go", SETTLE, || crate::docker_bridge::containers_of(&api_id).is_empty().then_some(()))
        .unwrap_or_else(|e| panic!("{e}\n{}", mesh.agent.logs()));
    assert_eq!(leases_of(&api_id), Vec::<PathBuf>::new());
    assert_eq!(rules_with(&api_id), Vec::<String>::new());
    assert_eq!(rules_with(&format!("{api_address}/32")), Vec::<String>::new());
    containers.1.0 = Some(dashboard["ID"].as_str().unwrap().to_string());
}

/// `examples/connect.nomad.hcl` as its comment says to run it: `job run` (which follows the
/// deployment until every alloc is healthy) and the dashboard answers with the API's greeting
/// through the mesh.
#[test]
fn the_connect_example_runs_through_the_cli_and_its_dashboard_answers_through_the_mesh() {
    nomad_testkit::require_prereqs!(Prereq::Root, Prereq::Iproute2, Prereq::CniPlugins, Prereq::Envoy, Prereq::Busybox, Prereq::Runc);
    let envoy = envoy_for_exec();
    let mesh = Mesh::start(4, "");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/connect.nomad.hcl");
    let var = format!("envoy={envoy}");
    let run = nomad(&mesh.agent, &["job", "run", "-var", &var, example.to_str().unwrap()]).expect(0, "job run examples/connect.nomad.hcl");
    assert!(run.stdout.contains("Monitoring deployment") && run.stdout.contains("successful"), "{}", run.stdout);
    let http = mesh.agent.http();
    let allocs = http.get_json("/v1/job/countdash/allocations").unwrap();
    let by_group = |g: &str| -> Value {
        let id = allocs.as_array().unwrap().iter().find(|a| a["TaskGroup"] == g).unwrap_or_else(|| panic!("{allocs:#}"))["ID"].clone();
        let alloc = http.get_json(&format!("/v1/allocation/{}", id.as_str().unwrap())).unwrap();
        mesh.net.track(&alloc);
        alloc
    };
    let (api, dashboard) = (by_group("api"), by_group("dashboard"));
    let reply = through_dashboard(&mesh, &dashboard, "count", &format!("count-api: hello from {}", api["ID"].as_str().unwrap()));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    crate::cli::stop_and_purge(&mesh.agent, "countdash");
}
