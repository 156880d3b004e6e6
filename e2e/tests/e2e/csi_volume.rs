//! CSI volumes end to end with real processes: one server, two clients, the workspace's
//! `csi-hostpath` as a raw_exec node plugin on each client (a system job; both plugins share
//! one state dir, so a volume is the same directory for both, as a network disk would be), and
//! `exec` consumer jobs pinned to one client or the other.
//!
//! In order, on one volume `vol1` (single-node-writer):
//! 1. a writer on client1 writes into its volume (the file appears in the volume's directory);
//! 2. a second writer on client2 finds no free claim and waits in a blocked eval;
//! 3. the first writer is stopped: its claim is released (the volume shows no allocs), and the
//!    second writer is placed on client2 and reads the first one's data back;
//! 4. client2's agent is killed with `kill -9` and started again while the task uses the volume:
//!    the task keeps its PID and the plugin records no second `NodePublishVolume`;
//! 5. a job whose task fails still unpublishes: the claim is released.

use std::path::{Path, PathBuf};

use nomad_e2e::{Agent, Cluster, ClusterOptions, HttpClient, wait_for};
use nomad_testkit::prereq::{self, Prereq};
use serde_json::{Value, json};

use crate::SETTLE;
use crate::cli::nomad;

/// `csi-hostpath`, built beside the `nomad-rs` binary by `cargo build --workspace --bins`.
pub(crate) fn hostpath_binary() -> PathBuf {
    let bin = nomad_e2e::binary().parent().expect("the binary's dir").join("csi-hostpath");
    assert!(bin.exists(), "{} is missing: build it first with `cargo build --workspace --bins`", bin.display());
    bin
}

fn plugin_job(plugin: &Path, statedir: &Path) -> String {
    plugin_job_with("csi-plugin", "node", plugin, statedir, &["--no-controller"])
}

/// A system job `name` running `csi-hostpath` as a raw_exec `plugin_type` plugin `hostpath` on
/// every client (node ID: the client's name) with `extra` flags; a killed plugin restarts
/// after 1 s.
pub(crate) fn plugin_job_with(name: &str, plugin_type: &str, plugin: &Path, statedir: &Path, extra: &[&str]) -> String {
    let extra: String = extra.iter().map(|a| format!(", {a:?}")).collect();
    format!(
        r#"
job "{name}" {{
  datacenters = ["dc1"]
  type        = "system"

  group "plugin" {{
    restart {{
      attempts = 5
      interval = "5m"
      delay    = "1s"
      mode     = "fail"
    }}

    task "plugin" {{
      driver = "raw_exec"

      config {{
        command = {plugin:?}
        args    = ["--nodeid", "${{node.unique.name}}", "--statedir", {statedir:?}{extra}]
      }}

      csi_plugin {{
        id   = "hostpath"
        type = "{plugin_type}"
      }}

      resources {{
        cpu    = 50
        memory = 64
      }}
    }}
  }}
}}
"#,
        statedir = statedir.display().to_string()
    )
}

/// A job on `node` with volume `vol1` at `/data`, running `script` under exec.
fn consumer_job(id: &str, node: &str, job_type: &str, script: &str) -> String {
    consumer_job_in("default", id, node, job_type, "vol1", script)
}

/// A job in `namespace` on `node` with CSI volume `source` at `/data`, running `script` under
/// exec.
pub(crate) fn consumer_job_in(namespace: &str, id: &str, node: &str, job_type: &str, source: &str, script: &str) -> String {
    let restart = if job_type == "batch" {
        "restart {\n      attempts = 0\n      mode     = \"fail\"\n    }\n    reschedule {\n      attempts  = 0\n      unlimited = false\n    }"
    } else {
        ""
    };
    format!(
        r#"
job "{id}" {{
  namespace   = "{namespace}"
  datacenters = ["dc1"]
  type        = "{job_type}"

  constraint {{
    attribute = "${{node.unique.name}}"
    value     = "{node}"
  }}

  group "g" {{
    {restart}

    volume "data" {{
      type            = "csi"
      source          = "{source}"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
    }}

    task "t" {{
      driver = "exec"

      config {{
        command = "/bin/sh"
        args    = ["-c", {script:?}]
      }}

      volume_mount {{
        volume      = "data"
        destination = "/data"
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

pub(crate) fn run_job(agent: &Agent, dir: &Path, name: &str, spec: &str) {
    let file = dir.join(format!("{name}.nomad.hcl"));
    std::fs::write(&file, spec).unwrap();
    nomad(agent, &["job", "run", "-detach", file.to_str().unwrap()]).expect(0, &format!("job run {name}"));
}

pub(crate) fn allocs(http: &HttpClient, job: &str) -> Vec<Value> {
    http.get_json(&format!("/v1/job/{job}/allocations")).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default()
}

pub(crate) fn logs(cluster: &Cluster) -> String {
    cluster.servers.iter().chain(cluster.clients.iter()).map(Agent::logs).collect::<Vec<_>>().join("\n")
}

/// The one alloc of `job` once its client status is `status`.
fn alloc_with_status(cluster: &Cluster, job: &str, status: &str) -> Value {
    alloc_with_status_at(cluster, &format!("/v1/job/{job}/allocations"), status)
}

/// The one alloc listed at `path` (a job's allocations, with its namespace) once its client
/// status is `status`.
pub(crate) fn alloc_with_status_at(cluster: &Cluster, path: &str, status: &str) -> Value {
    let http = cluster.servers[0].http();
    let list = || http.get_json(path).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default();
    wait_for(&format!("the alloc at {path} to be {status}"), SETTLE, || {
        let list = list();
        (list.len() == 1 && list[0]["ClientStatus"] == status).then(|| list[0].clone())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", list(), logs(cluster)))
}

/// The volume as `/v1/volume/csi/vol1` shows it, once `f` holds.
fn volume_when(cluster: &Cluster, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    volume_at_when(cluster, "/v1/volume/csi/vol1", what, f)
}

/// The volume as `path` (`/v1/volume/csi/<id>`, with its namespace) shows it, once `f` holds.
pub(crate) fn volume_at_when(cluster: &Cluster, path: &str, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let http = cluster.servers[0].http();
    wait_for(what, SETTLE, || http.get_json(path).ok().filter(|v| f(v)))
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", http.get_json(path), logs(cluster)))
}

pub(crate) fn no_claims(v: &Value) -> bool {
    let empty = |k: &str| v[k].is_null() || v[k].as_object().is_some_and(|m| m.is_empty());
    empty("WriteAllocs") && empty("ReadAllocs") && v["Allocations"].as_array().is_some_and(|a| a.is_empty())
}

/// `NodePublishVolume` calls the plugin on `client` answered (its task log).
pub(crate) fn publishes(client: &Agent) -> usize {
    let mut count = 0;
    let root = client.data_dir().join("alloc");
    for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let log = entry.path().join("alloc/logs/plugin.stderr.0");
        if let Ok(text) = std::fs::read_to_string(&log) {
            count += text.lines().filter(|l| l.contains("NodePublishVolume") && !l.contains("failed")).count();
        }
    }
    count
}

/// The PID of the process named `comm` with `NOMAD_ALLOC_ID=<alloc_id>` in its environment.
pub(crate) fn task_pid(alloc_id: &str, comm: &str) -> Option<i32> {
    let needle = format!("NOMAD_ALLOC_ID={alloc_id}");
    std::fs::read_dir("/proc").ok()?.filter_map(Result::ok).find_map(|entry| {
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let name = std::fs::read_to_string(entry.path().join("comm")).ok()?;
        if name.trim() != comm {
            return None;
        }
        let environ = std::fs::read(entry.path().join("environ")).ok()?;
        environ.split(|b| *b == 0).any(|var| var == needle.as_bytes()).then_some(pid)
    })
}

#[test]
fn a_csi_volume_moves_between_nodes_with_its_data_and_its_claims() {
    if !prereq::met(&[Prereq::Root]) {
        return;
    }
    let plugin = hostpath_binary();
    let mut cluster = Cluster::start(ClusterOptions { servers: 1, clients: 2, ..Default::default() }).expect("cluster");
    let server = &cluster.servers[0];
    let http = server.http();
    let dir = tempfile::tempdir().unwrap();
    let statedir = dir.path().join("hostpath");
    run_job(server, dir.path(), "plugin", &plugin_job(&plugin, &statedir));
    wait_for("two healthy node plugins", SETTLE, || {
        let p = http.get_json("/v1/plugin/csi/hostpath").ok()?;
        (p["NodesHealthy"] == 2).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));

    // The volume exists on the "storage" (a directory of the plugins' state dir), then is
    // registered.
    let volume_dir = statedir.join("volumes/vol1");
    std::fs::create_dir_all(&volume_dir).unwrap();
    // exec tasks run as nobody.
    std::fs::set_permissions(&volume_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let vol = json!({"Volumes": [{
        "ID": "vol1", "Name": "vol1", "ExternalID": "vol1", "Namespace": "default", "PluginID": "hostpath",
        "RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]
    }]});
    http.put_json("/v1/volume/csi/vol1", &vol).unwrap_or_else(|e| panic!("register: {e}\n{}", logs(&cluster)));

    // 1. A writer on client1.
    run_job(
        server,
        dir.path(),
        "writer1",
        &consumer_job("writer1", "client1", "service", "echo written-by-writer1 > /data/out.txt; exec sleep 600"),
    );
    let first = alloc_with_status(&cluster, "writer1", "running");
    wait_for("the writer's file in the volume", SETTLE, || {
        std::fs::read_to_string(volume_dir.join("out.txt")).ok().filter(|s| s.trim() == "written-by-writer1")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
    let claimed = volume_when(&cluster, "the writer's claim", |v| v["WriteAllocs"].get(first["ID"].as_str().unwrap()).is_some());
    assert_eq!(claimed["AccessMode"], "single-node-writer", "{claimed}");
    assert!(publishes(&cluster.clients[0]) >= 1, "client1's plugin published the volume");

    // 2. A second writer on client2: no free write claim, so a blocked eval.
    run_job(
        server,
        dir.path(),
        "writer2",
        &consumer_job("writer2", "client2", "service", "cat /data/out.txt > /data/seen.txt; exec sleep 600"),
    );
    wait_for("writer2's blocked eval", SETTLE, || {
        let evals = http.get_json("/v1/job/writer2/evaluations").ok()?;
        evals.as_array()?.iter().any(|e| e["Status"] == "blocked").then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", http.get_json("/v1/job/writer2/evaluations"), logs(&cluster)));
    assert!(allocs(&http, "writer2").is_empty(), "nothing placed while the volume is claimed");

    // 3. The first writer stops: the claim is released, the second writer runs on client2 and
    //    reads the first one's data.
    nomad(server, &["job", "stop", "-detach", "writer1"]).expect(0, "job stop writer1");
    let second = alloc_with_status(&cluster, "writer2", "running");
    let nodes = http.get_json("/v1/nodes").unwrap();
    let client2 = nodes.as_array().unwrap().iter().find(|n| n["Name"] == "client2").expect("client2's node").clone();
    assert_eq!(second["NodeID"], client2["ID"], "on client2");
    wait_for("the second writer to read the first one's data", SETTLE, || {
        std::fs::read_to_string(volume_dir.join("seen.txt")).ok().filter(|s| s.trim() == "written-by-writer1")
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
    let v = volume_when(&cluster, "only writer2's claim", |v| {
        v["WriteAllocs"].as_object().is_some_and(|m| m.len() == 1 && m.contains_key(second["ID"].as_str().unwrap()))
    });
    assert!(v["PastClaims"].is_null(), "claims are never shown");

    // 4. kill -9 of client2's agent while the task uses the volume: same task, no new publish.
    let second_id = second["ID"].as_str().unwrap().to_string();
    let pid = wait_for("writer2's task process", SETTLE, || task_pid(&second_id, "sleep")).unwrap();
    let published = publishes(&cluster.clients[1]);
    assert_eq!(published, 1, "one NodePublishVolume on client2");
    cluster.clients[1].restart().unwrap();
    wait_for("the restored agent to find the mount", SETTLE, || {
        cluster.clients[1].logs().contains("CSI volume still mounted: restored").then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
    assert_eq!(task_pid(&second_id, "sleep"), Some(pid), "the same task process");
    assert_eq!(publishes(&cluster.clients[1]), published, "no second NodePublishVolume");
    let a = http.get_json(&format!("/v1/allocation/{second_id}")).unwrap();
    assert_eq!(a["ClientStatus"], "running");
    nomad(server, &["job", "stop", "-detach", "writer2"]).expect(0, "job stop writer2");
    volume_when(&cluster, "writer2's claim released", no_claims);

    // 5. A failed alloc still unpublishes.
    run_job(server, dir.path(), "failing", &consumer_job("failing", "client1", "batch", "test -d /data && exit 3"));
    let failed = alloc_with_status(&cluster, "failing", "failed");
    let events = &failed["TaskStates"]["t"]["Events"];
    assert!(events.as_array().is_some_and(|e| e.iter().any(|e| e["ExitCode"] == 3)), "the task itself failed: {events}");
    volume_when(&cluster, "the failed alloc's claim released", no_claims);
    // Its publish target is gone from client1.
    let per_alloc = cluster.clients[0].data_dir().join("client/csi/node/hostpath/per-alloc").join(failed["ID"].as_str().unwrap());
    wait_for("the failed alloc's publish dir to be removed", SETTLE, || (!per_alloc.exists()).then_some(()))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
}
