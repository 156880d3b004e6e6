//! CSI claims released in the harder cases, with real agents and the real `csi-hostpath` plugin
//! (helpers from `csi_volume.rs`): the node plugin killed in the middle of an unpublish, a node
//! gone for good and `volume detach`, `job stop -purge`, the same volume ID in two namespaces,
//! a client upgraded from the unnamespaced staging layout while a task uses a volume, and
//! separate controller and node plugin jobs with the controller validating a registration and
//! publishing the volume.

use std::path::Path;

use nomad_e2e::{Agent, Cluster, ClusterOptions, HttpClient, wait_for};
use nomad_testkit::prereq::{self, Prereq};
use serde_json::{Value, json};

use crate::SETTLE;
use crate::cli::nomad;
use crate::csi_volume::{
    alloc_with_status_at, allocs, consumer_job_in, hostpath_binary, logs, no_claims, plugin_job_with, run_job, task_pid, volume_at_when,
};

/// A cluster of one server and `clients` clients running the node plugin (`extra` flags) of
/// `hostpath` from a system job, every plugin sharing `statedir`, all of them healthy.
fn cluster_with_node_plugins(clients: usize, server_config: &str, dir: &Path, extra: &[&str]) -> Cluster {
    let opts = ClusterOptions { servers: 1, clients, server_config: server_config.into(), ..Default::default() };
    let cluster = Cluster::start(opts).expect("cluster");
    let mut flags = vec!["--no-controller"];
    flags.extend_from_slice(extra);
    let spec = plugin_job_with("csi-plugin", "node", &hostpath_binary(), &dir.join("hostpath"), &flags);
    run_job(&cluster.servers[0], dir, "plugin", &spec);
    wait_for_plugin(&cluster, "NodesHealthy", clients);
    cluster
}

fn wait_for_plugin(cluster: &Cluster, field: &str, count: usize) {
    let http = cluster.servers[0].http();
    wait_for(&format!("{count} {field} of plugin hostpath"), SETTLE, || {
        let p = http.get_json("/v1/plugin/csi/hostpath").ok()?;
        (p[field] == count).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(cluster)));
}

/// Makes volume `external` on the plugins' storage (writable by exec's `nobody`) and registers
/// it as `id` in `namespace`.
fn register_volume(cluster: &Cluster, dir: &Path, namespace: &str, id: &str, external: &str) -> std::path::PathBuf {
    let volume_dir = dir.join("hostpath/volumes").join(external);
    std::fs::create_dir_all(&volume_dir).unwrap();
    std::fs::set_permissions(&volume_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let vol = json!({"Volumes": [{
        "ID": id, "Name": id, "ExternalID": external, "Namespace": namespace, "PluginID": "hostpath",
        "RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]
    }]});
    cluster.servers[0]
        .http()
        .put_json(&format!("/v1/volume/csi/{id}?namespace={namespace}"), &vol)
        .unwrap_or_else(|e| panic!("register {namespace}/{id}: {e}\n{}", logs(cluster)));
    volume_dir
}

fn wait_for_file(cluster: &Cluster, path: &Path, contents: &str) {
    wait_for(&format!("{contents:?} in {}", path.display()), SETTLE, || {
        std::fs::read_to_string(path).ok().filter(|s| s.trim() == contents)
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(cluster)));
}

/// The stderr of the `plugin` task of `alloc_id` on `client`.
fn plugin_log(client: &Agent, alloc_id: &str) -> String {
    std::fs::read_to_string(client.data_dir().join("alloc").join(alloc_id).join("alloc/logs/plugin.stderr.0")).unwrap_or_default()
}

/// Whether `log` (a plugin's stderr) shows `method` answered without error.
fn answered(log: &str, method: &str) -> bool {
    let needle = format!("ok method=\"{method}\"");
    log.lines().any(|l| l.contains(&needle))
}

/// Mount points on this host beneath `client`'s CSI root (staging and publish targets).
fn csi_mounts(client: &Agent) -> Vec<String> {
    let root = client.data_dir().join("client/csi");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts.lines().filter_map(|l| l.split_whitespace().nth(1)).filter(|m| Path::new(m).starts_with(&root)).map(str::to_string).collect()
}

fn node_id(http: &HttpClient, name: &str) -> String {
    let nodes = http.get_json("/v1/nodes").unwrap();
    nodes.as_array().unwrap().iter().find(|n| n["Name"] == name).expect("the node")["ID"].as_str().unwrap().to_string()
}

fn write_allocs(v: &Value) -> Vec<String> {
    v["WriteAllocs"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default()
}

const WRITE_AND_SLEEP: &str = "echo written > /data/out.txt; exec sleep 600";

#[test]
fn a_node_plugin_killed_mid_unpublish_releases_the_claim_once_it_is_back() {
    if !prereq::met(&[Prereq::Root]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Every NodeUnpublishVolume takes 5 s, long enough to kill the plugin in the middle of one.
    let cluster = cluster_with_node_plugins(1, "", dir.path(), &["--slow-call", "NodeUnpublishVolume=5000"]);
    let server = &cluster.servers[0];
    let http = server.http();
    let volume_dir = register_volume(&cluster, dir.path(), "default", "vol1", "vol1");
    run_job(server, dir.path(), "writer", &consumer_job_in("default", "writer", "client1", "service", "vol1", WRITE_AND_SLEEP));
    let writer = alloc_with_status_at(&cluster, "/v1/job/writer/allocations", "running");
    wait_for_file(&cluster, &volume_dir.join("out.txt"), "written");
    assert!(!csi_mounts(&cluster.clients[0]).is_empty(), "the volume is mounted");

    let plugin_alloc = allocs(&http, "csi-plugin")[0]["ID"].as_str().unwrap().to_string();
    let client = &cluster.clients[0];
    nomad(server, &["job", "stop", "-detach", "writer"]).expect(0, "job stop writer");
    wait_for("the unpublish to reach the plugin", SETTLE, || {
        plugin_log(client, &plugin_alloc)
            .lines()
            .any(|l| l.contains("slow call started") && l.contains("NodeUnpublishVolume"))
            .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
    let pid = task_pid(&plugin_alloc, "csi-hostpath").expect("the plugin's process");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    let v = http.get_json("/v1/volume/csi/vol1").unwrap();
    assert!(!no_claims(&v), "nothing released while the plugin is away: {v}");

    // The plugin restarts; the client's retried unmount goes through it, then its Unpublish.
    wait_for("the plugin to run again", SETTLE, || task_pid(&plugin_alloc, "csi-hostpath").filter(|p| *p != pid))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
    volume_at_when(&cluster, "/v1/volume/csi/vol1", "the writer's claim released", no_claims);
    let log = plugin_log(client, &plugin_alloc);
    assert!(answered(&log, "NodeUnpublishVolume"), "unpublished after the restart:\n{log}");
    assert_eq!(csi_mounts(client), Vec::<String>::new(), "no mount left");
    let per_alloc = client.data_dir().join("client/csi/node/hostpath/per-alloc").join(writer["ID"].as_str().unwrap());
    wait_for("the writer's publish dir to be removed", SETTLE, || (!per_alloc.exists()).then_some(()))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));

    // Claimable again.
    run_job(server, dir.path(), "again", &consumer_job_in("default", "again", "client1", "service", "vol1", "exec sleep 600"));
    let again = alloc_with_status_at(&cluster, "/v1/job/again/allocations", "running");
    volume_at_when(&cluster, "/v1/volume/csi/vol1", "the new claim", |v| write_allocs(v) == [again["ID"].as_str().unwrap()]);
}

#[test]
fn a_volume_on_a_node_gone_for_good_is_freed_by_volume_detach_for_another_node() {
    if !prereq::met(&[Prereq::Root]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Heartbeat TTLs of 1-2 s, so the stopped node is down within seconds.
    let fast_heartbeats = "  heartbeat_grace = \"1s\"\n  min_heartbeat_ttl = \"1s\"";
    let mut cluster = cluster_with_node_plugins(2, fast_heartbeats, dir.path(), &[]);
    let http = cluster.servers[0].http();
    let volume_dir = register_volume(&cluster, dir.path(), "default", "vol1", "vol1");
    let writer_spec = consumer_job_in("default", "writer1", "client1", "service", "vol1", WRITE_AND_SLEEP);
    run_job(&cluster.servers[0], dir.path(), "writer1", &writer_spec);
    let first = alloc_with_status_at(&cluster, "/v1/job/writer1/allocations", "running");
    wait_for_file(&cluster, &volume_dir.join("out.txt"), "written");
    volume_at_when(&cluster, "/v1/volume/csi/vol1", "writer1's claim", |v| write_allocs(v) == [first["ID"].as_str().unwrap()]);

    // client1 stops for good, with its claim.
    let client1 = node_id(&http, "client1");
    cluster.clients[0].kill9().unwrap();
    wait_for("client1 to be down", SETTLE, || (http.get_json(&format!("/v1/node/{client1}")).ok()?["Status"] == "down").then_some(()))
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));

    let detached = nomad(&cluster.servers[0], &["volume", "detach", "vol1", &client1[..8]]);
    detached.expect(0, "volume detach");
    volume_at_when(&cluster, "/v1/volume/csi/vol1", "the down node's claim freed", no_claims);

    // A new job on client2 claims the volume and reads writer1's data.
    let reader_spec =
        consumer_job_in("default", "writer2", "client2", "service", "vol1", "cat /data/out.txt > /data/seen.txt; exec sleep 600");
    run_job(&cluster.servers[0], dir.path(), "writer2", &reader_spec);
    let second = alloc_with_status_at(&cluster, "/v1/job/writer2/allocations", "running");
    assert_eq!(second["NodeID"], node_id(&http, "client2"));
    wait_for_file(&cluster, &volume_dir.join("seen.txt"), "written");
    volume_at_when(&cluster, "/v1/volume/csi/vol1", "writer2's claim", |v| write_allocs(v) == [second["ID"].as_str().unwrap()]);
}

#[test]
fn job_stop_with_purge_releases_the_claims() {
    if !prereq::met(&[Prereq::Root]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with_node_plugins(1, "", dir.path(), &[]);
    let server = &cluster.servers[0];
    let http = server.http();
    register_volume(&cluster, dir.path(), "default", "vol1", "vol1");
    run_job(server, dir.path(), "writer", &consumer_job_in("default", "writer", "client1", "service", "vol1", WRITE_AND_SLEEP));
    let writer = alloc_with_status_at(&cluster, "/v1/job/writer/allocations", "running");
    volume_at_when(&cluster, "/v1/volume/csi/vol1", "the writer's claim", |v| write_allocs(v) == [writer["ID"].as_str().unwrap()]);

    nomad(server, &["job", "stop", "-purge", "-detach", "writer"]).expect(0, "job stop -purge");
    assert!(http.get_json("/v1/job/writer").is_err(), "purged");
    volume_at_when(&cluster, "/v1/volume/csi/vol1", "the purged job's claim released", no_claims);
    wait_for("no CSI mount left", SETTLE, || csi_mounts(&cluster.clients[0]).is_empty().then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", csi_mounts(&cluster.clients[0]), logs(&cluster)));

    run_job(server, dir.path(), "next", &consumer_job_in("default", "next", "client1", "service", "vol1", "exec sleep 600"));
    let next = alloc_with_status_at(&cluster, "/v1/job/next/allocations", "running");
    volume_at_when(&cluster, "/v1/volume/csi/vol1", "the next job's claim", |v| write_allocs(v) == [next["ID"].as_str().unwrap()]);
}

#[test]
fn the_same_volume_id_in_two_namespaces_is_two_volumes_with_their_own_claims() {
    if !prereq::met(&[Prereq::Root]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with_node_plugins(1, "", dir.path(), &[]);
    let server = &cluster.servers[0];
    let http = server.http();
    http.put_json("/v1/namespace/other", &json!({"Name": "other"})).unwrap();
    let dir_a = register_volume(&cluster, dir.path(), "default", "vol1", "vol-a");
    let dir_b = register_volume(&cluster, dir.path(), "other", "vol1", "vol-b");

    // Both single-node-writer and both claimed at once: they are not the same volume.
    let script = |who: &str| format!("echo {who} > /data/out.txt; exec sleep 600");
    run_job(server, dir.path(), "writer-a", &consumer_job_in("default", "writer", "client1", "service", "vol1", &script("a")));
    run_job(server, dir.path(), "writer-b", &consumer_job_in("other", "writer", "client1", "service", "vol1", &script("b")));
    let a = alloc_with_status_at(&cluster, "/v1/job/writer/allocations?namespace=default", "running");
    let b = alloc_with_status_at(&cluster, "/v1/job/writer/allocations?namespace=other", "running");
    wait_for_file(&cluster, &dir_a.join("out.txt"), "a");
    wait_for_file(&cluster, &dir_b.join("out.txt"), "b");
    let (a_id, b_id) = (a["ID"].as_str().unwrap(), b["ID"].as_str().unwrap());
    volume_at_when(&cluster, "/v1/volume/csi/vol1?namespace=default", "default's claim", |v| write_allocs(v) == [a_id]);
    volume_at_when(&cluster, "/v1/volume/csi/vol1?namespace=other", "other's claim", |v| write_allocs(v) == [b_id]);
    // Each namespace's volume is staged at its own path on the one node.
    let mounts = csi_mounts(&cluster.clients[0]);
    for ns in ["default", "other"] {
        let staging = format!("/staging/{ns}/vol1/rw-file-system-single-node-writer");
        assert!(mounts.iter().any(|m| m.ends_with(&staging)), "{staging} in {mounts:?}");
    }
    let all = http.get_json("/v1/volumes?type=csi&namespace=*").unwrap();
    let mut listed: Vec<(String, String)> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["Namespace"].as_str().unwrap().to_string(), v["ID"].as_str().unwrap().to_string()))
        .collect();
    listed.sort();
    assert_eq!(listed, [("default".to_string(), "vol1".to_string()), ("other".to_string(), "vol1".to_string())]);

    // Stopping default's writer frees default's volume only.
    nomad(server, &["job", "stop", "-detach", "writer"]).expect(0, "job stop writer (default)");
    volume_at_when(&cluster, "/v1/volume/csi/vol1?namespace=default", "default's claim released", no_claims);
    let other = http.get_json("/v1/volume/csi/vol1?namespace=other").unwrap();
    assert_eq!(write_allocs(&other), [b_id], "other's claim stays: {other}");
}

/// The `csi` alloc hook's stubs of `alloc_id` in a stopped client's `client.redb`, rewritten by
/// `edit` (the table and value format the agent keeps, see `agent/src/client/state.rs`).
fn edit_csi_stubs(client: &Agent, alloc_id: &str, edit: impl FnOnce(&mut Value)) {
    use redb::ReadableTable;
    const ALLOC_HOOKS: redb::TableDefinition<(&str, &str), &[u8]> = redb::TableDefinition::new("alloc_hooks");
    let db = redb::Database::create(client.data_dir().join("client/client.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut table = txn.open_table(ALLOC_HOOKS).unwrap();
        let mut state: Value =
            serde_json::from_slice(table.get((alloc_id, "csi")).unwrap().expect("the csi hook's state").value()).unwrap();
        let mut stubs: Value = serde_json::from_str(state["data"]["volumes"].as_str().unwrap()).unwrap();
        edit(&mut stubs);
        state["data"]["volumes"] = Value::String(stubs.to_string());
        table.insert((alloc_id, "csi"), serde_json::to_vec(&state).unwrap().as_slice()).unwrap();
    }
    txn.commit().unwrap();
}

#[test]
fn a_client_upgraded_while_a_task_uses_a_volume_staged_without_a_namespace_keeps_it_then_unstages_it_there() {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    if !prereq::met(&[Prereq::Root]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster_with_node_plugins(1, "", dir.path(), &[]);
    let volume_dir = register_volume(&cluster, dir.path(), "default", "vol1", "vol1");
    run_job(
        &cluster.servers[0],
        dir.path(),
        "writer",
        &consumer_job_in("default", "writer", "client1", "service", "vol1", WRITE_AND_SLEEP),
    );
    let writer = alloc_with_status_at(&cluster, "/v1/job/writer/allocations", "running");
    let writer_id = writer["ID"].as_str().unwrap().to_string();
    wait_for_file(&cluster, &volume_dir.join("out.txt"), "written");
    let pid = wait_for("the writer's process", SETTLE, || task_pid(&writer_id, "sleep")).unwrap();

    // The client goes away; what it leaves is made to look as an agent from before namespaced
    // staging left it: the volume staged at staging/<vol>/<usage>, stubs without a layout.
    cluster.clients[0].kill9().unwrap();
    let root = cluster.clients[0].data_dir().join("client/csi/node/hostpath");
    let usage = "rw-file-system-single-node-writer";
    let legacy = root.join("staging/vol1").join(usage);
    std::fs::create_dir_all(&legacy).unwrap();
    mount(Some(&volume_dir), &legacy, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
    umount2(&root.join("staging/default/vol1").join(usage), MntFlags::empty()).unwrap();
    std::fs::remove_dir_all(root.join("staging/default")).unwrap();
    edit_csi_stubs(&cluster.clients[0], &writer_id, |stubs| {
        stubs["data"]["MountInfo"].as_object_mut().unwrap().remove("StagingLayout").expect("the new agent writes a layout");
    });

    // The upgraded agent keeps the mount as it is, under the same task.
    cluster.clients[0].restart().unwrap();
    wait_for("the restored agent to find the mount", SETTLE, || {
        cluster.clients[0].logs().contains("CSI volume still mounted: restored").then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
    assert_eq!(task_pid(&writer_id, "sleep"), Some(pid), "the same task process");

    // Its release unstages where the volume was staged: nothing stays mounted.
    nomad(&cluster.servers[0], &["job", "stop", "-detach", "writer"]).expect(0, "job stop writer");
    volume_at_when(&cluster, "/v1/volume/csi/vol1", "the writer's claim released", no_claims);
    wait_for("no CSI mount left", SETTLE, || csi_mounts(&cluster.clients[0]).is_empty().then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", csi_mounts(&cluster.clients[0]), logs(&cluster)));
    assert!(!root.join("staging/default").exists(), "nothing was staged again at the namespaced path");
}

const CREATED_VOLUME: &str = r#"
id        = "data"
name      = "data"
type      = "csi"
plugin_id = "hostpath"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}
"#;

/// The controller's publications in the plugins' shared `state.json`: (volume, node) pairs.
fn controller_publications(dir: &Path) -> Vec<(String, String)> {
    let Ok(bytes) = std::fs::read(dir.join("hostpath/state.json")) else { return Vec::new() };
    let record: Value = serde_json::from_slice(&bytes).unwrap();
    let published = record["published"].as_array().cloned().unwrap_or_default();
    published.iter().map(|p| (p["volume_id"].as_str().unwrap().to_string(), p["node_id"].as_str().unwrap().to_string())).collect()
}

#[test]
fn separate_controller_and_node_plugins_publish_stage_and_unpublish_a_volume() {
    if !prereq::met(&[Prereq::Root]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with_node_plugins(1, "", dir.path(), &[]);
    let server = &cluster.servers[0];
    let http = server.http();
    let controller_spec = plugin_job_with("csi-controller", "controller", &hostpath_binary(), &dir.path().join("hostpath"), &[]);
    run_job(server, dir.path(), "controller", &controller_spec);
    wait_for_plugin(&cluster, "ControllersHealthy", 1);
    // One plugin, its two sides served by two allocs.
    let plugin = http.get_json("/v1/plugin/csi/hostpath").unwrap();
    let node = node_id(&http, "client1");
    let node_alloc = allocs(&http, "csi-plugin")[0]["ID"].as_str().unwrap().to_string();
    let controller_alloc = allocs(&http, "csi-controller")[0]["ID"].as_str().unwrap().to_string();
    assert_eq!(plugin["Nodes"][&node]["AllocID"], node_alloc.as_str(), "{plugin}");
    assert_eq!(plugin["Controllers"][&node]["AllocID"], controller_alloc.as_str(), "{plugin}");
    assert_eq!(plugin["NodesHealthy"], 1, "{plugin}");

    let spec = dir.path().join("data.hcl");
    std::fs::write(&spec, CREATED_VOLUME).unwrap();
    nomad(server, &["volume", "create", spec.to_str().unwrap()]).expect(0, "volume create");
    let external = http.get_json("/v1/volume/csi/data").unwrap()["ExternalID"].as_str().unwrap().to_string();

    // Registering goes through the controller's ValidateVolumeCapabilities: a volume the plugin
    // does not have is refused with Nomad's error and not registered; one it has is.
    let registration = |id: &str, external: &str| {
        json!({"Volumes": [{
            "ID": id, "Name": id, "ExternalID": external, "PluginID": "hostpath",
            "RequestedCapabilities": [{"AccessMode": "single-node-writer", "AttachmentMode": "file-system"}]
        }]})
    };
    let refused = http.put_json("/v1/volume/csi/ghost", &registration("ghost", "no-such-volume")).unwrap_err().to_string();
    assert!(
        refused.contains("controller validate volume: CSI.ControllerValidateVolume: volume \"no-such-volume\" could not be found"),
        "{refused}"
    );
    assert!(http.get_json("/v1/volume/csi/ghost").is_err(), "not registered");
    http.put_json("/v1/volume/csi/alias", &registration("alias", &external)).unwrap_or_else(|e| panic!("{e}\n{}", logs(&cluster)));
    nomad(server, &["volume", "deregister", "alias"]).expect(0, "volume deregister alias");
    let volume_dir = dir.path().join("hostpath/volumes").join(&external);
    std::fs::set_permissions(&volume_dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();

    run_job(server, dir.path(), "writer", &consumer_job_in("default", "writer", "client1", "service", "data", WRITE_AND_SLEEP));
    let writer = alloc_with_status_at(&cluster, "/v1/job/writer/allocations", "running");
    wait_for_file(&cluster, &volume_dir.join("out.txt"), "written");
    // The controller published the volume to the node plugin's node ID before the node staged it.
    assert_eq!(controller_publications(dir.path()), [(external.clone(), "client1".to_string())]);
    let node_log = plugin_log(&cluster.clients[0], &node_alloc);
    for method in ["NodeStageVolume", "NodePublishVolume"] {
        assert!(answered(&node_log, method), "{method} on the node plugin:\n{node_log}");
    }
    assert!(!node_log.contains("ControllerPublishVolume"), "the node plugin is not asked to publish:\n{node_log}");
    volume_at_when(&cluster, "/v1/volume/csi/data", "the writer's claim", |v| write_allocs(v) == [writer["ID"].as_str().unwrap()]);

    nomad(server, &["job", "stop", "-detach", "writer"]).expect(0, "job stop writer");
    volume_at_when(&cluster, "/v1/volume/csi/data", "the writer's claim released", no_claims);
    wait_for("the controller to unpublish the volume", SETTLE, || controller_publications(dir.path()).is_empty().then_some(()))
        .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", controller_publications(dir.path()), logs(&cluster)));
    let controller_log = plugin_log(&cluster.clients[0], &controller_alloc);
    assert!(
        answered(&controller_log, "ControllerUnpublishVolume"),
        "ControllerUnpublishVolume on the controller plugin:\n{controller_log}"
    );
    assert_eq!(csi_mounts(&cluster.clients[0]), Vec::<String>::new(), "no mount left");
}
