use std::collections::BTreeMap;

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::job::{JobType, ReschedulePolicy, RestartPolicy, UpdateStrategy};

const FULL: &str = include_str!("testdata/full.hcl");
const SECOND: i64 = 1_000_000_000;

fn parse_ok(src: &str) -> Job {
    parse(src, &ParseOptions { filename: "job.hcl".into(), ..ParseOptions::default() }).unwrap_or_else(|e| panic!("{e}"))
}

fn parse_err(src: &str) -> JobspecError {
    parse_err_with(src, &ParseOptions::default())
}

fn parse_err_with(src: &str, opts: &ParseOptions) -> JobspecError {
    let opts = ParseOptions { filename: "job.hcl".into(), ..opts.clone() };
    match parse(src, &opts) {
        Ok(job) => panic!("expected an error, got {job:?}"),
        Err(e) => e,
    }
}

fn with_vars(vars: &[(&str, &str)]) -> ParseOptions {
    ParseOptions { variables: vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), ..ParseOptions::default() }
}

/// A one-group job around a task body, for tests about one thing.
fn job_with_task(task_body: &str) -> String {
    format!("job \"j\" {{\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"raw_exec\"\n{task_body}\n    }}\n  }}\n}}\n")
}

#[test]
fn full_job_decodes_every_block() {
    let job = parse_ok(FULL);
    assert_eq!((job.id.as_str(), job.name.as_str(), job.region.as_str(), job.namespace.as_str()), ("example", "example", "eu", "prod"));
    assert_eq!((job.job_type, job.priority, job.node_pool.as_str()), (JobType::Service, 70, "fast"));
    assert_eq!(job.datacenters, ["dc1", "dc2"]);
    assert_eq!(job.meta["owner"], "team-a");

    let ops: Vec<(&str, &str, &str)> =
        job.constraints.iter().map(|c| (c.l_target.as_str(), c.operand.as_str(), c.r_target.as_str())).collect();
    assert_eq!(
        ops,
        [
            ("${attr.kernel.name}", "=", "linux"),
            ("", "distinct_hosts", ""),
            ("${meta.rack}", "distinct_property", ""),
            ("${attr.nomad.version}", "version", ">= 1.5"),
            ("${meta.tags}", "set_contains", "ssd"),
            ("${node.unique.name}", "regexp", "^web-[0-9]+$"),
        ]
    );
    assert_eq!((job.affinities[0].r_target.as_str(), job.affinities[0].weight), ("dc1", 80));
    let spread = &job.spreads[0];
    assert_eq!((spread.attribute.as_str(), spread.weight), ("${node.datacenter}", 100));
    assert_eq!(spread.spread_target.iter().map(|t| (t.value.as_str(), t.percent)).collect::<Vec<_>>(), [("dc1", 70), ("dc2", 30)]);

    let update = job.update.as_ref().unwrap();
    assert_eq!((update.max_parallel, update.min_healthy_time, update.canary, update.auto_promote), (2, 30 * SECOND, 1, true));
    assert_eq!(update.healthy_deadline, UpdateStrategy::default_service().healthy_deadline, "unset update keys keep the default");

    let g = &job.task_groups[0];
    assert_eq!((g.name.as_str(), g.count), ("cache", 2), "count comes from var.replicas");
    assert_eq!(g.shutdown_delay, Some(5 * SECOND));
    assert_eq!(g.max_client_disconnect, Some(3600 * SECOND));
    assert_eq!(g.update.as_ref().unwrap().max_parallel, 2, "the job's update reaches the group");
    assert_eq!(g.migrate.as_ref().unwrap().max_parallel, 3, "the job's migrate reaches the group");
    let resched = g.reschedule_policy.as_ref().unwrap();
    assert_eq!(
        (resched.attempts, resched.interval, resched.delay, resched.delay_function.as_str()),
        (5, 3600 * SECOND, 60 * SECOND, "constant")
    );
    assert!(!resched.unlimited);
    assert_eq!(resched.max_delay, ReschedulePolicy::default_service().max_delay);
    let restart = g.restart_policy.as_ref().unwrap();
    assert_eq!((restart.attempts, restart.interval, restart.delay, restart.mode.as_str()), (0, 30 * 60 * SECOND, 15 * SECOND, "fail"));
    assert_eq!((g.ephemeral_disk.size_mb, g.ephemeral_disk.sticky), (500, true));
    let scaling = g.scaling.as_ref().unwrap();
    assert_eq!((scaling.min, scaling.max, scaling.policy_type.as_str(), scaling.enabled), (Some(1), Some(5), "horizontal", Some(true)));
    assert_eq!(serde_json::Value::Object(scaling.policy.clone().unwrap()), json!({"cooldown": "1m"}));

    // Ports: static > 0 is reserved, everything else dynamic.
    let net = &g.networks[0];
    assert_eq!((net.mode.as_str(), net.hostname.as_str()), ("bridge", "cache-host"));
    assert_eq!(net.dns.as_ref().unwrap().servers, ["1.1.1.1"]);
    assert_eq!(net.dynamic_ports.len(), 1);
    assert_eq!((net.dynamic_ports[0].label.as_str(), net.dynamic_ports[0].value, net.dynamic_ports[0].to), ("db", 0, 6379));
    assert_eq!(net.reserved_ports.len(), 1);
    let admin = &net.reserved_ports[0];
    assert_eq!((admin.label.as_str(), admin.value, admin.to, admin.host_network.as_str()), ("admin", 8080, 80, "public"));

    // Services, checks (in order), check_restart, connect with upstreams (in order).
    let svc = &g.services[0];
    assert_eq!((svc.name.as_str(), svc.port_label.as_str(), svc.provider.as_str()), ("cache-redis", "db", "consul"));
    assert_eq!(svc.tags, ["cache", "v2"]);
    assert_eq!(svc.checks.len(), 2);
    assert_eq!(
        (svc.checks[0].name.as_str(), svc.checks[0].check_type.as_str(), svc.checks[0].interval, svc.checks[0].timeout),
        ("alive", "grpc", 10 * SECOND, 2 * SECOND)
    );
    let http = &svc.checks[1];
    assert_eq!((http.path.as_str(), http.port_label.as_str(), http.method.as_str()), ("/health", "admin", "GET"));
    assert_eq!((http.interval, http.timeout), (5400 * SECOND, 250_000_000));
    assert_eq!(http.header["Authorization"], ["Basic x"]);
    let cr = http.check_restart.as_ref().unwrap();
    assert_eq!((cr.limit, cr.grace), (3, 90 * SECOND));
    let connect = svc.connect.as_ref().unwrap();
    let sidecar = connect.sidecar_service.as_ref().unwrap();
    assert_eq!((sidecar.port.as_str(), sidecar.tags.as_slice()), ("20000", ["mesh".to_string()].as_slice()));
    let proxy = sidecar.proxy.as_ref().unwrap();
    assert_eq!(proxy.local_service_port, 6379);
    let upstreams: Vec<(&str, i64, &str)> =
        proxy.upstreams.iter().map(|u| (u.destination_name.as_str(), u.local_bind_port, u.datacenter.as_str())).collect();
    assert_eq!(upstreams, [("db", 5432, ""), ("search", 9200, "dc2")]);
    assert!(proxy.upstreams[0].config.is_empty());
    assert_eq!(proxy.upstreams[1].config["connect_timeout_ms"], json!(1500), "an upstream's config is kept for Consul");
    assert_eq!(proxy.config["protocol"], json!("tcp"));
    let sidecar_resources = connect.sidecar_task.as_ref().unwrap().resources.as_ref().unwrap();
    assert_eq!((sidecar_resources.cpu, sidecar_resources.memory_mb), (250, 128));
    let terminating = g.services[1].connect.as_ref().unwrap().gateway.as_ref().unwrap().terminating.as_ref().unwrap();
    assert_eq!((terminating.services[0].name.as_str(), terminating.services[0].ca_file.as_str()), ("legacy", "/etc/ca.pem"));

    // Volumes and mounts.
    let vol = &g.volumes["data"];
    assert_eq!((vol.name.as_str(), vol.volume_type.as_str(), vol.source.as_str()), ("data", "csi", "redis-vol"));
    assert_eq!((vol.access_mode.as_str(), vol.attachment_mode.as_str(), vol.per_alloc), ("single-node-writer", "file-system", true));
    let mount_options = vol.mount_options.as_ref().unwrap();
    assert_eq!((mount_options.fs_type.as_str(), mount_options.mount_flags.as_slice()), ("ext4", ["noatime".to_string()].as_slice()));

    let redis = g.lookup_task("redis").unwrap();
    assert_eq!((redis.driver.as_str(), redis.user.as_str(), redis.leader), ("docker", "redis", true));
    assert_eq!(redis.config["image"], json!("redis:7"));
    assert_eq!(redis.config["args"], json!(["--port", "${NOMAD_PORT_db}"]));
    assert_eq!(redis.config["port_map"], json!([{"db": 6379}]), "nested config blocks are lists of maps");
    assert_eq!(redis.config["labels"], json!([{"app": "cache"}]), "object attributes in config are lists of maps too");
    assert_eq!((redis.resources.cpu, redis.resources.memory_mb, redis.resources.memory_max_mb), (500, 256, 512));
    assert_eq!((redis.resources.devices[0].name.as_str(), redis.resources.devices[0].count), ("nvidia/gpu", 2));
    assert_eq!(redis.volume_mounts[0].volume, "data");
    assert_eq!((redis.volume_mounts[0].destination.as_str(), redis.volume_mounts[0].read_only), ("/data", true));
    let tmpl = &redis.templates[0];
    assert_eq!(tmpl.embedded_tmpl, "port={{ env \"NOMAD_PORT_db\" }}\n", "heredoc indentation is stripped");
    assert_eq!((tmpl.dest_path.as_str(), tmpl.change_mode.as_str(), tmpl.change_signal.as_str()), ("local/redis.conf", "signal", "SIGHUP"));
    assert_eq!((tmpl.splay, tmpl.perms.as_str()), (5 * SECOND, "0644"), "template defaults");
    let artifact = &redis.artifacts[0];
    assert_eq!((artifact.getter_source.as_str(), artifact.relative_dest.as_str()), ("https://example.com/redis.tar.gz", "local/redis"));
    assert_eq!(artifact.getter_options["checksum"], "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!((redis.log_config.max_files, redis.log_config.max_file_size_mb, redis.log_config.disabled), (3, 5, false));
    assert_eq!((redis.kill_timeout, redis.kill_signal.as_str()), (20 * SECOND, "SIGTERM"));
    assert_eq!(redis.meta["team.name"], "cache", "meta as a map attribute allows dotted keys");

    let init = g.lookup_task("init").unwrap();
    let lifecycle = init.lifecycle.as_ref().unwrap();
    assert_eq!((lifecycle.hook.as_str(), lifecycle.sidecar), ("prestart", false));

    let plugin = g.lookup_task("plugin").unwrap().csi_plugin_config.as_ref().unwrap();
    assert_eq!((plugin.id.as_str(), plugin.plugin_type.as_str(), plugin.mount_dir.as_str()), ("ebs", "node", "/csi"));
    assert_eq!((plugin.stage_publish_base_dir.as_str(), plugin.health_timeout), ("/local/csi", 30 * SECOND));
}

#[test]
fn full_job_round_trips_through_nomads_json_and_validates() {
    let job = parse_ok(FULL);
    let text = serde_json::to_string(&job).unwrap();
    let wire: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(wire["TaskGroups"][0]["Networks"][0]["ReservedPorts"][0]["Value"], json!(8080));
    assert_eq!(wire["TaskGroups"][0]["MaxClientDisconnect"], json!(3_600_000_000_000i64));
    assert_eq!(wire["TaskGroups"][0]["Tasks"][0]["Resources"]["MemoryMB"], json!(256));
    let back: Job = crate::lenient::from_slice(text.as_bytes()).unwrap();
    assert_eq!(back, job);

    let mut job = job;
    job.canonicalize();
    job.validate().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn second_fixture_covers_the_remaining_blocks() {
    let job = parse_ok(include_str!("testdata/batch.hcl"));
    assert_eq!(job.job_type, JobType::Batch);
    assert_eq!((job.vault_token.as_str(), job.consul_token.as_str()), ("s.token", "c.token"));
    let periodic = job.periodic.as_ref().unwrap();
    assert!(periodic.enabled, "periodic blocks are enabled unless they say otherwise");
    assert_eq!(periodic.specs, ["0 2 * * *", "0 14 * * *"]);
    assert_eq!((periodic.spec_type.as_str(), periodic.prohibit_overlap, periodic.time_zone.as_str()), ("cron", true, "Europe/Berlin"));
    let parameterized = job.parameterized_job.as_ref().unwrap();
    assert_eq!((parameterized.payload.as_str(), parameterized.meta_required.as_slice()), ("required", ["customer".to_string()].as_slice()));
    assert_eq!(parameterized.meta_optional, ["tier"]);
    let multiregion = job.multiregion.as_ref().unwrap();
    assert_eq!(multiregion["Strategy"], json!({"MaxParallel": 1, "OnFailure": "fail_all"}));
    assert_eq!(multiregion["Regions"][0]["Name"], json!("west"));
    assert_eq!(multiregion["Regions"][0]["Count"], json!(2));

    let g = &job.task_groups[0];
    assert_eq!(g.stop_after_client_disconnect, Some(90 * SECOND));
    assert_eq!(g.meta["tier"], "gold");
    assert_eq!((g.constraints[0].operand.as_str(), g.constraints[0].r_target.as_str()), ("!=", "arm64"));
    let affinity = &g.affinities[0];
    assert_eq!((affinity.operand.as_str(), affinity.r_target.as_str(), affinity.weight), ("set_contains_any", "gpu,fpga", -20));
    assert_eq!(g.spreads[0].weight, 50, "spreads weigh 50 unless told");
    assert_eq!(g.consul, Some(json!({"Namespace": "billing"})));
    let resched = g.reschedule_policy.as_ref().unwrap();
    let default = ReschedulePolicy::default_batch();
    assert_eq!(
        (resched.max_delay, resched.attempts, resched.delay),
        (2 * 3600 * SECOND, default.attempts, default.delay),
        "the job's reschedule block on the batch default"
    );
    assert!(g.migrate.is_none() && g.update.is_none(), "no job or group block: left to canonicalize");
    assert_eq!((g.volumes["scratch"].volume_type.as_str(), g.volumes["scratch"].source.as_str()), ("host", "scratch-disk"));
    assert_eq!((g.ephemeral_disk.migrate, g.ephemeral_disk.size_mb), (true, 300));

    let ingress = &g.services[0];
    assert_eq!((ingress.port_label.as_str(), ingress.address_mode.as_str(), ingress.address.as_str()), ("8443", "host", "10.0.0.1"));
    assert_eq!((ingress.task_name.as_str(), ingress.on_update.as_str(), ingress.provider.as_str()), ("runner", "ignore", "nomad"));
    assert_eq!((ingress.canary_tags.as_slice(), ingress.meta["version"].as_str()), (["canary".to_string()].as_slice(), "2"));
    let script = &ingress.checks[0];
    assert_eq!((script.check_type.as_str(), script.command.as_str()), ("script", "/bin/check"));
    assert_eq!(script.args, ["-v", "${NOMAD_TASK_NAME}"]);
    let restart = script.check_restart.as_ref().unwrap();
    assert_eq!(
        (restart.limit, restart.grace, restart.ignore_warnings),
        (2, 15 * SECOND, true),
        "the check refines the service's check_restart"
    );
    let connect = ingress.connect.as_ref().unwrap();
    assert!(connect.native);
    let listener = &connect.gateway.as_ref().unwrap().ingress.as_ref().unwrap()["Listeners"][0];
    assert_eq!((listener["Port"].as_i64(), listener["Services"][0]["Hosts"][0].as_str()), (Some(8080), Some("api.example.com")));
    let proxy = g.services[1].connect.as_ref().unwrap().sidecar_service.as_ref().unwrap().proxy.as_ref().unwrap();
    assert_eq!(proxy.local_service_address, "127.0.0.2");
    assert_eq!(proxy.expose.as_ref().unwrap()["Paths"][0]["LocalPathPort"], json!(9102));

    let t = &g.tasks[0];
    assert_eq!((t.kind.as_str(), t.shutdown_delay), ("connect-proxy:mesh", 3 * SECOND));
    assert_eq!((t.constraints[0].l_target.as_str(), t.affinities[0].weight), ("${attr.os.name}", 50));
    assert_eq!((t.services[0].name.as_str(), t.services[0].port_label.as_str()), ("runner-metrics", "metrics"));
    assert_eq!((t.resources.cores, t.resources.disk_mb, t.resources.memory_mb), (2, 1024, 300));
    let task_net = &t.resources.networks[0];
    assert_eq!((task_net.mbits, task_net.dynamic_ports[0].label.as_str()), (10, "metrics"));
    assert_eq!(t.volume_mounts[0].propagation_mode, "host-to-task");
    assert_eq!(t.lifecycle.as_ref().map(|l| (l.hook.as_str(), l.sidecar)), Some(("poststart", true)));
    assert!(t.log_config.disabled);
    assert_eq!((t.artifacts[0].getter_mode.as_str(), t.artifacts[0].relative_dest.as_str()), ("file", "local/run.sh"));
    assert_eq!(t.artifacts[0].getter_headers["User-Agent"], "nomad-rs");
    assert_eq!(t.identity, Some(json!({"Env": true, "File": false})));
    assert_eq!(t.dispatch_payload, Some(json!({"File": "input.json"})));
    assert_eq!(t.scaling_policies[0]["Type"], json!("vertical_mem"));
    assert_eq!(t.scaling_policies[0]["Max"], json!(2048));
    assert_eq!(t.vault.as_ref().unwrap()["Policies"], json!(["reader"]), "the job's vault reaches the task");
    assert_eq!(t.vault.as_ref().unwrap()["ChangeMode"], json!("restart"));
    let plugin = t.csi_plugin_config.as_ref().unwrap();
    assert_eq!((plugin.plugin_type.as_str(), plugin.health_timeout), ("monolith", 60 * SECOND));
}

#[test]
fn task_directly_under_job_gets_its_own_group_first() {
    let job = parse_ok(
        r#"
job "batchy" {
  type = "batch"
  task "solo" {
    driver = "raw_exec"
    config { command = "/bin/date" }
  }
  group "g" {
    task "t" { driver = "raw_exec" }
  }
}
"#,
    );
    let names: Vec<&str> = job.task_groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["solo", "g"]);
    let solo = &job.task_groups[0];
    assert_eq!((solo.count, solo.tasks.len(), solo.tasks[0].name.as_str()), (1, 1, "solo"));
    assert_eq!(solo.tasks[0].config["command"], json!("/bin/date"));
}

#[test]
fn runtime_interpolations_stay_literal_and_escapes_unescape() {
    let job = parse_ok(&job_with_task(
        r#"
      env {
        ALLOC   = "${NOMAD_ALLOC_ID}"
        KERNEL  = "${attr.kernel.name}"
        RACK    = "rack-${meta.rack}-${NOMAD_ALLOC_INDEX}"
        HOME    = "${env.HOME}"
        PORT    = "${NOMAD_PORT_http}"
        ESCAPED = "$${NOT_ME}"
        BARE    = node.unique.name
      }
"#,
    ));
    let env = &job.task_groups[0].tasks[0].env;
    assert_eq!(env["ALLOC"], "${NOMAD_ALLOC_ID}");
    assert_eq!(env["KERNEL"], "${attr.kernel.name}");
    assert_eq!(env["RACK"], "rack-${meta.rack}-${NOMAD_ALLOC_INDEX}");
    assert_eq!(env["HOME"], "${env.HOME}");
    assert_eq!(env["PORT"], "${NOMAD_PORT_http}");
    assert_eq!(env["ESCAPED"], "${NOT_ME}");
    assert_eq!(env["BARE"], "${node.unique.name}", "a bare unknown traversal becomes an interpolation, as in Nomad");
}

#[test]
fn expressions_functions_and_templates_evaluate() {
    let job = parse_ok(
        r#"
variable "dcs" {
  type    = list(string)
  default = ["a", "b"]
}
locals {
  # locals may refer to locals defined later
  upper_dcs = [for dc in local.dcs : upper(dc)]
  dcs       = var.dcs
  ports     = { http = 80, https = 443 }
}
job "j" {
  datacenters = "${local.upper_dcs}"
  meta = {
    joined   = join(",", local.upper_dcs)
    count    = length(var.dcs) * 2 + 1
    cond     = length(var.dcs) > 1 ? "many" : "one"
    fmt      = format("%s-%03d", "web", 7)
    listing  = "%{ for dc in var.dcs ~}[${dc}]%{ endfor ~}"
    strip    = "a  ${~ "b" ~}  c"
    if_dir   = "%{ if length(var.dcs) == 2 }two%{ else }other%{ endif }"
    lookup   = lookup(local.ports, "https", 0)
    json     = jsonencode({ a = 1 })
    min      = min(3, 1, 2)
    mixed    = "${upper("x")}-${NOMAD_JOB_NAME}"
  }
  group "g" {
    network {
      dynamic "port" {
        for_each = local.ports
        labels   = [port.key]
        content {
          static = port.value
        }
      }
    }
    task "t" { driver = "raw_exec" }
  }
}
"#,
    );
    assert_eq!(job.datacenters, ["A", "B"], "a lone interpolation keeps the list type");
    let meta = &job.meta;
    assert_eq!(meta["joined"], "A,B");
    assert_eq!(meta["count"], "5");
    assert_eq!(meta["cond"], "many");
    assert_eq!(meta["fmt"], "web-007");
    assert_eq!(meta["listing"], "[a][b]");
    assert_eq!(meta["strip"], "abc");
    assert_eq!(meta["if_dir"], "two");
    assert_eq!(meta["lookup"], "443");
    assert_eq!(meta["json"], r#"{"a":1}"#);
    assert_eq!(meta["min"], "1");
    assert_eq!(meta["mixed"], "X-${NOMAD_JOB_NAME}");
    let ports: Vec<(&str, i64)> = job.task_groups[0].networks[0].reserved_ports.iter().map(|p| (p.label.as_str(), p.value)).collect();
    assert_eq!(ports, [("http", 80), ("https", 443)], "dynamic blocks expand in order");
}

const VARIABLE_JOB: &str = r#"
variable "image" {
  type = string
}
variable "count" {
  type    = number
  default = 1
}
variable "canary" {
  type    = bool
  default = false
}
variable "dcs" {
  type    = list(string)
  default = ["dc1"]
}
variable "untyped" {
  default = "plain"
}
job "j" {
  datacenters = var.dcs
  meta {
    image   = var.image
    canary  = var.canary
    untyped = var.untyped
  }
  group "g" {
    count = var.count
    task "t" {
      driver = "docker"
      config { image = var.image }
    }
  }
}
"#;

#[test]
fn variables_use_defaults_and_options_with_type_conversion() {
    let job = parse(VARIABLE_JOB, &with_vars(&[("image", "nginx")])).unwrap();
    assert_eq!(job.task_groups[0].count, 1, "default");
    assert_eq!(job.datacenters, ["dc1"]);
    assert_eq!(job.meta["image"], "nginx");
    assert_eq!(job.meta["canary"], "false");

    let job = parse(
        VARIABLE_JOB,
        &with_vars(&[("image", "redis"), ("count", "3"), ("canary", "true"), ("dcs", r#"["east", "west"]"#), ("untyped", "42")]),
    )
    .unwrap();
    assert_eq!(job.task_groups[0].count, 3, "the -var string \"3\" becomes the number 3");
    assert_eq!(job.meta["canary"], "true");
    assert_eq!(job.datacenters, ["east", "west"], "list(string) values are parsed as HCL");
    assert_eq!(job.meta["untyped"], "42");
    assert_eq!(job.task_groups[0].tasks[0].config["image"], json!("redis"));
}

#[test]
fn variable_files_apply_in_order_and_options_win() {
    let opts = ParseOptions {
        var_files: vec![("a.vars".into(), "image = \"from-a\"\ncount = 4\n".into()), ("b.vars".into(), "image = \"from-b\"\n".into())],
        variables: [("count".to_string(), "7".to_string())].into_iter().collect(),
        ..ParseOptions::default()
    };
    let job = parse(VARIABLE_JOB, &opts).unwrap();
    assert_eq!(job.meta["image"], "from-b");
    assert_eq!(job.task_groups[0].count, 7);

    let bad_file = ParseOptions { var_files: vec![("bad.vars".into(), "image = \"x\"\nnope = 1\n".into())], ..ParseOptions::default() };
    let e = parse_err_with(VARIABLE_JOB, &bad_file);
    assert_eq!(e.file, "bad.vars");
    assert_eq!(e.position, Some(Position { line: 2, column: 1 }));
    assert!(e.message.contains("\"nope\" is set but not declared"), "{e}");
}

#[test]
fn unset_required_variable_is_an_error_naming_it() {
    let e = parse_err(VARIABLE_JOB);
    assert_eq!(e.kind, ErrorKind::Variable);
    assert!(e.message.contains("unset variable \"image\""), "{e}");
    assert_eq!(e.position, Some(Position { line: 2, column: 1 }), "points at the declaration");
}

#[test]
fn unknown_or_badly_typed_var_option_is_an_error() {
    let e = parse_err_with(VARIABLE_JOB, &with_vars(&[("image", "x"), ("imagee", "y")]));
    assert_eq!(e.kind, ErrorKind::Variable);
    assert!(e.message.contains("\"imagee\" was given with -var but is not declared"), "{e}");

    let e = parse_err_with(VARIABLE_JOB, &with_vars(&[("image", "x"), ("count", "three")]));
    assert!(e.message.contains("invalid value for -var count") && e.message.contains("number required"), "{e}");

    let e = parse_err_with("job \"j\" {\n  meta {\n    x = var.missing\n  }\n}\n", &ParseOptions::default());
    assert!(e.message.contains("undeclared variable \"missing\""), "{e}");
    assert_eq!(e.position, Some(Position { line: 3, column: 12 }));
}

#[test]
fn variable_validation_blocks_are_checked() {
    let src = r#"
variable "count" {
  type = number
  validation {
    condition     = var.count > 0
    error_message = "Count must be positive."
  }
}
job "j" {
  meta { c = var.count }
}
"#;
    assert_eq!(parse(src, &with_vars(&[("count", "2")])).unwrap().meta["c"], "2");
    let e = parse_err_with(src, &with_vars(&[("count", "0")]));
    assert!(e.message.contains("Count must be positive."), "{e}");
}

const RESTART_JOB: &str = r#"
job "j" {
  type = "TYPE"
  group "g" {
    restart {
      attempts = 0
    }
    reschedule {
      attempts = 7
    }
    update {
      canary = 2
    }
    task "t" {
      driver = "raw_exec"
      restart {
        delay = "1s"
      }
    }
  }
  group "plain" {
    task "t" { driver = "raw_exec" }
  }
}
"#;

#[test]
fn restart_reschedule_and_update_overlay_the_job_type_defaults() {
    let service = parse_ok(&RESTART_JOB.replace("TYPE", "service"));
    let g = &service.task_groups[0];
    let restart = g.restart_policy.as_ref().unwrap();
    let default = RestartPolicy::default_service();
    assert_eq!(restart.attempts, 0, "the written key wins");
    assert_eq!((restart.interval, restart.delay, restart.mode.as_str()), (default.interval, default.delay, default.mode.as_str()));
    let task_restart = g.tasks[0].restart_policy.as_ref().unwrap();
    assert_eq!(
        (task_restart.attempts, task_restart.delay, task_restart.interval),
        (0, SECOND, default.interval),
        "task restart refines the group's"
    );
    let resched = g.reschedule_policy.as_ref().unwrap();
    let default = ReschedulePolicy::default_service();
    assert_eq!(resched.attempts, 7);
    assert_eq!((resched.delay, resched.delay_function.as_str(), resched.unlimited), (default.delay, "exponential", true));
    let update = g.update.as_ref().unwrap();
    assert_eq!(update.canary, 2);
    assert_eq!(update.max_parallel, UpdateStrategy::default_service().max_parallel);
    assert!(service.task_groups[1].restart_policy.is_none(), "no block: canonicalize fills the default");

    let batch = parse_ok(&RESTART_JOB.replace("TYPE", "batch"));
    let g = &batch.task_groups[0];
    let restart = g.restart_policy.as_ref().unwrap();
    let default = RestartPolicy::default_batch();
    assert_eq!(restart.attempts, 0);
    assert_eq!((restart.interval, restart.delay), (default.interval, default.delay), "batch jobs start from the batch default");
    let resched = g.reschedule_policy.as_ref().unwrap();
    let default = ReschedulePolicy::default_batch();
    assert_eq!(resched.attempts, 7);
    assert_eq!(
        (resched.interval, resched.delay, resched.delay_function.as_str(), resched.unlimited),
        (default.interval, default.delay, "constant", false)
    );

    let mut canonical = batch.clone();
    canonical.canonicalize();
    assert_eq!(canonical.task_groups[1].restart_policy, Some(RestartPolicy::default_batch()));
}

#[test]
fn syntax_error_reports_line_and_column() {
    let e = parse_err("job \"j\" {\n  group \"g\" {\n    count = \n  }\n}\n");
    assert_eq!(e.kind, ErrorKind::Syntax);
    assert_eq!(e.position, Some(Position { line: 3, column: 13 }));
    assert!(e.to_string().starts_with("job.hcl:3:13: syntax error: invalid expression"), "{e}");
}

#[test]
fn unknown_attribute_is_named_located_and_corrected() {
    let e = parse_err("job \"j\" {\n  group \"web\" {\n    cout = 3\n    task \"t\" { driver = \"raw_exec\" }\n  }\n}\n");
    assert_eq!(e.kind, ErrorKind::UnknownKey);
    assert_eq!(e.to_string(), "job.hcl:3:5: unknown attribute \"cout\" in group \"web\"; did you mean \"count\"?");

    let e = parse_err(&job_with_task("      resorces { cpu = 100 }"));
    assert_eq!(e.position, Some(Position { line: 5, column: 7 }));
    assert!(e.message.contains("unknown block \"resorces\" in task \"t\"; did you mean \"resources\"?"), "{e}");

    let e = parse_err(&job_with_task("      logs { max_file = 1 }"));
    assert!(e.message.contains("unknown attribute \"max_file\" in logs block of task \"t\""), "{e}");

    let e = parse_err(&job_with_task("      restart = {}"));
    assert!(e.message.contains("\"restart\" in task \"t\" is a block, not an attribute"), "{e}");
}

#[test]
fn bad_duration_names_the_attribute() {
    let e = parse_err("job \"j\" {\n  group \"g\" {\n    restart {\n      interval = \"5x\"\n    }\n  }\n}\n");
    assert_eq!(e.kind, ErrorKind::Duration);
    assert_eq!(e.position, Some(Position { line: 4, column: 18 }));
    assert!(e.message.contains("invalid duration for \"interval\" in restart block of group \"g\""), "{e}");
    assert!(e.message.contains("unknown unit \"x\""), "{e}");
}

#[test]
fn wrong_type_says_what_was_expected() {
    let e = parse_err("job \"j\" {\n  group \"g\" {\n    count = \"two\"\n  }\n}\n");
    assert_eq!(e.kind, ErrorKind::Type);
    assert_eq!(e.position, Some(Position { line: 3, column: 13 }));
    assert!(e.message.contains("invalid value for \"count\" in group \"g\": expected a whole number, got string \"two\""), "{e}");

    let e = parse_err("job \"j\" {\n  datacenters = \"dc1\"\n}\n");
    assert!(e.message.contains("expected a list of strings"), "{e}");
    let e = parse_err("job \"j\" {\n  type = \"daemon\"\n}\n");
    assert_eq!(e.kind, ErrorKind::InvalidValue);
}

#[test]
fn job_block_count_must_be_exactly_one() {
    let e = parse_err("job \"a\" {}\n\njob \"b\" {}\n");
    assert_eq!(e.kind, ErrorKind::Structure);
    assert_eq!(e.position, Some(Position { line: 3, column: 1 }));
    assert!(e.message.contains("only one job block"), "{e}");

    let e = parse_err("variable \"x\" { default = 1 }\n");
    assert!(e.message.contains("no job block"), "{e}");
    let e = parse_err("");
    assert!(e.message.contains("no job block"), "{e}");
    assert_eq!(e.to_string(), "job.hcl: no job block found; a job file needs one job \"<id>\" { ... } block");

    let e = parse_err("jbo \"a\" {}\n");
    assert!(e.message.contains("did you mean \"job\"?"), "{e}");
    let e = parse_err("job {}\n");
    assert!(e.message.contains("exactly one label"), "{e}");
}

#[test]
fn expression_errors_point_at_the_expression() {
    let e = parse_err("job \"j\" {\n  meta {\n    x = nosuch(1)\n  }\n}\n");
    assert_eq!(e.kind, ErrorKind::Expression);
    assert_eq!(e.position, Some(Position { line: 3, column: 9 }));
    assert!(e.message.contains("nosuch(): call to unknown function"), "{e}");

    let e = parse_err("job \"j\" {\n  priority = 1 / 0\n}\n");
    assert!(e.message.contains("division by zero"), "{e}");

    // Exponential growth through locals hits the budget instead of memory.
    let mut src = String::from("locals {\n  l0 = \"xxxxxxxxxxxxxxxx\"\n");
    for i in 1..64 {
        src.push_str(&format!("  l{i} = \"${{local.l{}}}${{local.l{}}}\"\n", i - 1, i - 1));
    }
    src.push_str("}\njob \"j\" {\n  meta { x = local.l63 }\n}\n");
    let e = parse_err(&src);
    assert_eq!(e.kind, ErrorKind::Expression);
}

#[test]
fn meta_and_env_accept_block_or_attribute_but_not_both() {
    let job = parse_ok(&job_with_task("      env = { \"A.B\" = \"1\", C = 2 }"));
    assert_eq!(job.task_groups[0].tasks[0].env, BTreeMap::from([("A.B".to_string(), "1".to_string()), ("C".to_string(), "2".to_string())]));
    let e = parse_err(&job_with_task("      env = { A = \"1\" }\n      env { B = \"2\" }"));
    assert!(e.message.contains("both as an attribute and as a block"), "{e}");
}

/// Edits of a valid job file: cut a range, insert HCL-ish tokens, or swap two ranges.
fn mutated_job() -> impl Strategy<Value = String> {
    let tokens = prop_oneof![
        Just("{".to_string()),
        Just("}".to_string()),
        Just("\"".to_string()),
        Just("${".to_string()),
        Just("%{".to_string()),
        Just("~".to_string()),
        Just("=".to_string()),
        Just("\n".to_string()),
        Just("[".to_string()),
        Just("var.".to_string()),
        Just("local.x".to_string()),
        Just("dynamic \"port\" {".to_string()),
        Just("<<EOT\n".to_string()),
        Just("-1".to_string()),
        Just("1e400".to_string()),
        Just("é".to_string()),
        "[a-z_]{1,8}".prop_map(|s| s),
        any::<char>().prop_map(|c| c.to_string()),
    ];
    let chars: Vec<char> = FULL.chars().collect();
    let len = chars.len();
    proptest::collection::vec((0..3u8, 0..len, 0..len, tokens), 1..6).prop_map(move |edits| {
        let mut text = chars.clone();
        for (kind, a, b, token) in edits {
            let (a, b) = (a.min(text.len()), b.min(text.len()));
            let (lo, hi) = (a.min(b), a.max(b));
            match kind {
                0 => {
                    text.drain(lo..hi.min(lo + 40));
                }
                1 => {
                    text.splice(lo..lo, token.chars());
                }
                _ => {
                    let piece: Vec<char> = text[lo..hi.min(lo + 20)].to_vec();
                    text.splice(hi..hi, piece);
                }
            }
        }
        text.into_iter().collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(src in ".{0,200}") {
        let _ = parse(&src, &ParseOptions::default());
    }

    #[test]
    fn hcl_like_text_never_panics(src in "[{}\\[\\]()\"=$%~<>!?:.,*+/a-z0-9 \n-]{0,200}") {
        let _ = parse(&format!("job \"j\" {{\n{src}\n}}\n"), &ParseOptions::default());
    }

    #[test]
    fn mutated_job_files_never_panic(src in mutated_job()) {
        // Either result is fine; what matters is returning one.
        if let Err(e) = parse(&src, &ParseOptions::default())
            && let Some(p) = e.position
        {
            prop_assert!(p.line >= 1 && p.column >= 1);
        }
    }
}

#[test]
fn deeply_nested_expressions_are_refused_or_evaluated_without_overflow() {
    for depth in [10usize, 40, 63, 64, 65, 200, 5000] {
        let cases = [
            format!("{}1{}", "[".repeat(depth), "]".repeat(depth)),
            format!("{}1{}", "(".repeat(depth), ")".repeat(depth)),
            format!("{}\"x\"{}", "upper(".repeat(depth), ")".repeat(depth)),
            format!("{}1{}", "\"${".repeat(depth), "}\"".repeat(depth)),
            format!("{}1{}", "[for x in [1] : ".repeat(depth), "]".repeat(depth)),
            format!("{}1{}", "{a = ".repeat(depth), "}".repeat(depth)),
            format!("1{}", " + 1".repeat(depth)),
            format!("{}true", "!".repeat(depth)),
            format!("{}1", "-".repeat(depth)),
        ];
        for expr in cases {
            let src = format!("job \"j\" {{\n  meta = {{ x = {expr} }}\n}}\n");
            let _ = parse(&src, &ParseOptions::default());
            let blocks = format!("job \"j\" {{\n{}{}\n}}\n", "group \"g\" {\n".repeat(depth), "}\n".repeat(depth));
            let _ = parse(&blocks, &ParseOptions::default());
            let config = job_with_task(&format!("config {{\n{}{}\n}}", "a \"l\" {\n".repeat(depth), "}\n".repeat(depth)));
            let _ = parse(&config, &ParseOptions::default());
            let directives = format!("{}x{}", "%{ if true }".repeat(depth), "%{ endif }".repeat(depth));
            let _ = parse(&format!("job \"j\" {{\n  meta = {{ x = \"{directives}\" }}\n}}\n"), &ParseOptions::default());
        }
    }
}

#[test]
fn nesting_100_000_deep_is_a_syntax_error_naming_the_limit() {
    let n = 100_000;
    let exprs = [
        format!("{}1{}", "[".repeat(n), "]".repeat(n)),
        format!("{}1{}", "(".repeat(n), ")".repeat(n)),
        format!("{}1{}", "{a = ".repeat(n), "}".repeat(n)),
        format!("{}\"x\"{}", "upper(".repeat(n), ")".repeat(n)),
        format!("{}true", "!".repeat(n)),
        format!("1{}", " + 1".repeat(n)),
        format!("{}1{}", "true ? ".repeat(n), " : 2".repeat(n)),
    ];
    for expr in &exprs {
        let e = parse_err(&format!("job \"j\" {{\n  meta = {{ x = {expr} }}\n}}\n"));
        assert_eq!(e.kind, ErrorKind::Syntax, "{e}");
        assert!(e.message.contains("nesting depth") || e.message.contains("at most 128"), "{}: {e}", &expr[..20]);
    }
    let blocks = job_with_task(&format!("config {{\n{}{}\n}}", "a {\n".repeat(n), "}\n".repeat(n)));
    let e = parse_err(&blocks);
    assert!(e.message.contains("expected at most 64 nested levels"), "{e}");
}

#[test]
fn the_deepest_nesting_the_parser_allows_evaluates_on_a_worker_stack() {
    // Within hcl-edit's limits (64 levels, 128 chained operators) the evaluator recurses as
    // deep as the tree; 2 MiB is a tokio worker's stack (where `/v1/jobs/parse` runs it).
    // Operators count across parentheses (at most 128 in one tree), so 50 levels of 2 each.
    let expr = (0..50).fold("1".to_string(), |inner, _| format!("({}{inner})", "1 + ".repeat(2)));
    let list = format!("{}1{}", "[".repeat(50), "]".repeat(50));
    let src = format!(
        "job \"j\" {{\n  meta = {{ x = \"${{{expr}}}\" }}\n  group \"g\" {{\n    task \"t\" {{\n      driver = \"raw_exec\"\n      config {{ x = {list} }}\n    }}\n  }}\n}}\n"
    );
    let job = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(move || parse(&src, &ParseOptions::default()))
        .unwrap()
        .join()
        .expect("no stack overflow");
    let job = job.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(job.meta["x"], (50 * 2 + 1).to_string());
}

#[test]
fn files_past_the_size_limit_are_refused_before_parsing() {
    let big = format!("job \"j\" {{\n{}}}\n", "# padding\n".repeat(MAX_JOBSPEC_BYTES / 10 + 1));
    let e = parse_err(&big);
    assert_eq!(e.kind, ErrorKind::Structure);
    assert!(e.to_string().starts_with("job.hcl: the file is ") && e.message.contains("at most 4194304"), "{e}");
    let opts = ParseOptions { var_files: vec![("big.vars".into(), big.clone())], ..ParseOptions::default() };
    let e = parse_err_with("job \"j\" {\n}\n", &opts);
    assert!(e.to_string().starts_with("big.vars: the file is "), "{e}");
}

#[test]
fn deep_json_from_jsondecode_is_an_error() {
    let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    let e = parse_err(&job_with_task(&format!("config {{ x = jsondecode(\"{deep}\") }}")));
    assert!(e.message.contains("invalid JSON") && e.message.contains("recursion limit"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn nested_inputs_of_any_depth_never_overflow(depth in 0usize..3_000, kind in 0usize..6) {
        let (open, close) = [("[", "]"), ("(", ")"), ("{a = ", "}"), ("upper(", ")"), ("!", ""), ("-", "")][kind];
        let expr = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        let _ = parse(&format!("job \"j\" {{\n  meta = {{ x = {expr} }}\n}}\n"), &ParseOptions::default());
        let blocks = job_with_task(&format!("config {{\n{}{}\n}}", "a {\n".repeat(depth), "}\n".repeat(depth)));
        if let Err(e) = parse(&blocks, &ParseOptions::default()) {
            prop_assert!(depth < 64 || e.message.contains("nested levels"), "{}: {}", depth, e);
        } else {
            prop_assert!(depth < 64, "{} nested blocks accepted", depth);
        }
    }
}
