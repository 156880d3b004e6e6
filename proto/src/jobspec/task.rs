//! `task "<name>"` blocks and what only tasks have: resources, templates,
//! artifacts, logs, lifecycle, volume mounts, CSI plugin settings.

use serde_json::json;

use crate::job::{ChangeScript, CsiPluginConfig, LogConfig, RestartPolicy, Task, TaskArtifact, TaskLifecycle, Template, WaitConfig};
use crate::resources::{RequestedDevice, Resources};
use crate::volume::VolumeMount;

use super::error::{DResult, Diag, ErrorKind};
use super::network::network;
use super::placement::{affinity, constraint};
use super::policies::RestartOverrides;
use super::reader::{BlockRef, Reader};
use super::service::service;

const NS_PER_SEC: i64 = 1_000_000_000;

/// Decodes a task. `group_restart` is the restart policy the task inherits
/// (the group's, or the job type's default), which a task `restart` block refines.
pub(crate) fn task(r: &Reader<'_>, block: &BlockRef<'_>, group_restart: &RestartPolicy) -> DResult<Task> {
    let mut t = Task { name: block.label().to_string(), ..Task::default() };
    r.set_string("driver", &mut t.driver)?;
    r.set_string("user", &mut t.user)?;
    r.set_string("kind", &mut t.kind)?;
    r.set_string("kill_signal", &mut t.kill_signal)?;
    r.set_bool("leader", &mut t.leader)?;
    r.set_duration("kill_timeout", &mut t.kill_timeout)?;
    r.set_duration("shutdown_delay", &mut t.shutdown_delay)?;
    r.set_string_map("env", &mut t.env)?;
    r.set_string_map("meta", &mut t.meta)?;
    if let Some(config) = r.free_form("config")? {
        t.config = config;
    }
    for c in r.blocks("constraint", 0)? {
        t.constraints.push(constraint(&r.child(&c)?)?);
    }
    for a in r.blocks("affinity", 0)? {
        t.affinities.push(affinity(&r.child(&a)?)?);
    }
    for s in r.blocks("service", 0)? {
        t.services.push(service(&r.child(&s)?)?);
    }
    if let Some(b) = r.block("resources")? {
        t.resources = resources(&r.child(&b)?)?;
    }
    if let Some(b) = r.block("restart")? {
        let mut policy = group_restart.clone();
        RestartOverrides::read(&r.child(&b)?)?.apply(&mut policy);
        t.restart_policy = Some(policy);
    }
    if let Some(b) = r.block("lifecycle")? {
        let lr = r.child(&b)?;
        let mut lifecycle = TaskLifecycle::default();
        lr.set_string("hook", &mut lifecycle.hook)?;
        lr.set_bool("sidecar", &mut lifecycle.sidecar)?;
        lr.finish()?;
        t.lifecycle = Some(lifecycle);
    }
    if let Some(b) = r.block("logs")? {
        t.log_config = log_config(&r.child(&b)?)?;
    }
    for b in r.blocks("template", 0)? {
        t.templates.push(template(&r.child(&b)?)?);
    }
    for b in r.blocks("artifact", 0)? {
        t.artifacts.push(artifact(&r.child(&b)?)?);
    }
    for b in r.blocks("volume_mount", 0)? {
        let vr = r.child(&b)?;
        let mut m = VolumeMount::default();
        vr.set_string("volume", &mut m.volume)?;
        vr.set_string("destination", &mut m.destination)?;
        vr.set_bool("read_only", &mut m.read_only)?;
        vr.set_string("propagation_mode", &mut m.propagation_mode)?;
        vr.finish()?;
        t.volume_mounts.push(m);
    }
    if let Some(b) = r.block("csi_plugin")? {
        t.csi_plugin_config = Some(csi_plugin(&r.child(&b)?)?);
    }
    if let Some(b) = r.block("vault")? {
        t.vault = Some(vault(&r.child(&b)?)?);
    }
    if let Some(b) = r.block("identity")? {
        let ir = r.child(&b)?;
        t.identity = Some(json!({ "Env": ir.bool("env")?.unwrap_or_default(), "File": ir.bool("file")?.unwrap_or_default() }));
        ir.finish()?;
    }
    if let Some(b) = r.block("dispatch_payload")? {
        let dr = r.child(&b)?;
        t.dispatch_payload = Some(json!({ "File": dr.string("file")?.unwrap_or_default() }));
        dr.finish()?;
    }
    for b in r.blocks("scaling", 1)? {
        let policy_type = match b.label() {
            "cpu" => "vertical_cpu",
            "mem" => "vertical_mem",
            other => {
                return Err(Diag::new(
                    ErrorKind::InvalidValue,
                    b.offset,
                    format!("scaling policy \"{other}\" in {} must be named \"cpu\" or \"mem\"", r.context()),
                ));
            }
        };
        if t.scaling_policies.iter().any(|p| p["Type"] == policy_type) {
            return Err(Diag::new(
                ErrorKind::Structure,
                b.offset,
                format!("only one scaling \"{}\" block is allowed in {}", b.label(), r.context()),
            ));
        }
        t.scaling_policies.push(scaling_policy(&r.child(&b)?, policy_type)?);
    }
    r.finish()?;
    Ok(t)
}

/// Decodes `resources`; unset keys keep Nomad's task defaults (100 MHz, 300 MiB).
pub(crate) fn resources(r: &Reader<'_>) -> DResult<Resources> {
    let mut res = Resources::default();
    r.set_int("cpu", &mut res.cpu)?;
    r.set_int("cores", &mut res.cores)?;
    r.set_int("memory", &mut res.memory_mb)?;
    r.set_int("memory_max", &mut res.memory_max_mb)?;
    r.set_int("disk", &mut res.disk_mb)?;
    // Deprecated in Nomad and ignored by its scheduler.
    let _iops = r.int("iops")?;
    for n in r.blocks("network", 0)? {
        res.networks.push(network(&r.child(&n)?)?);
    }
    for d in r.blocks("device", 1)? {
        let dr = r.child(&d)?;
        let mut device = RequestedDevice { name: d.label().to_string(), count: 1, ..RequestedDevice::default() };
        if let Some(count) = dr.int("count")? {
            device.count = u64::try_from(count).map_err(|_| dr.invalid("count", d.offset, "must not be negative"))?;
        }
        for c in dr.blocks("constraint", 0)? {
            device.constraints.push(constraint(&dr.child(&c)?)?);
        }
        for a in dr.blocks("affinity", 0)? {
            device.affinities.push(affinity(&dr.child(&a)?)?);
        }
        dr.finish()?;
        res.devices.push(device);
    }
    r.finish()?;
    Ok(res)
}

/// Decodes `logs`; unset keys keep the defaults (10 files of 10 MiB).
pub(crate) fn log_config(r: &Reader<'_>) -> DResult<LogConfig> {
    let mut logs = LogConfig::default();
    r.set_int("max_files", &mut logs.max_files)?;
    r.set_int("max_file_size", &mut logs.max_file_size_mb)?;
    // `enabled` is the pre-1.6 spelling of `!disabled`.
    if let Some(enabled) = r.bool("enabled")? {
        logs.disabled = !enabled;
    }
    r.set_bool("disabled", &mut logs.disabled)?;
    r.finish()?;
    Ok(logs)
}

/// Decodes `template` with the defaults Nomad fills (restart on change, mode
/// 0644, 5 s splay, `{{ }}` delimiters). `data` is kept as HCL2 evaluates it:
/// `$${`/`%%{` unescaped, runtime `${...}` left literal, everything else
/// (Go template actions in any delimiters) byte for byte.
fn template(r: &Reader<'_>) -> DResult<Template> {
    let mut t = Template::default();
    r.set_string("source", &mut t.source_path)?;
    r.set_string("destination", &mut t.dest_path)?;
    r.set_string("data", &mut t.embedded_tmpl)?;
    r.set_string("change_mode", &mut t.change_mode)?;
    r.set_string("change_signal", &mut t.change_signal)?;
    r.set_duration("splay", &mut t.splay)?;
    r.set_string("perms", &mut t.perms)?;
    r.set_bool("env", &mut t.envvars)?;
    t.uid = r.int("uid")?;
    t.gid = r.int("gid")?;
    r.set_duration("vault_grace", &mut t.vault_grace)?;
    r.set_bool("error_on_missing_key", &mut t.err_missing_key)?;
    if let Some(w) = r.block("wait")? {
        let wr = r.child(&w)?;
        t.wait = Some(WaitConfig { min: wr.duration("min")?, max: wr.duration("max")? });
        wr.finish()?;
    }
    r.set_string("left_delimiter", &mut t.left_delim)?;
    r.set_string("right_delimiter", &mut t.right_delim)?;
    if let Some(b) = r.block("change_script")? {
        let cr = r.child(&b)?;
        let mut script = ChangeScript::default();
        cr.set_string("command", &mut script.command)?;
        cr.set_strings("args", &mut script.args)?;
        cr.set_duration("timeout", &mut script.timeout)?;
        cr.set_bool("fail_on_error", &mut script.fail_on_error)?;
        cr.finish()?;
        t.change_script = Some(script);
    }
    r.finish()?;
    Ok(t)
}

/// Decodes `artifact` with Nomad's defaults: mode `any`, destination `local/`
/// (`local/<file name>` in `file` mode).
fn artifact(r: &Reader<'_>) -> DResult<TaskArtifact> {
    let mut a = TaskArtifact { getter_mode: "any".to_string(), ..TaskArtifact::default() };
    r.set_string("source", &mut a.getter_source)?;
    r.set_string("mode", &mut a.getter_mode)?;
    r.set_string_map("options", &mut a.getter_options)?;
    r.set_string_map("headers", &mut a.getter_headers)?;
    a.relative_dest = match r.string("destination")? {
        Some(dest) => dest,
        None => TaskArtifact::default_destination(&a.getter_mode, &a.getter_source),
    };
    r.finish()?;
    Ok(a)
}

/// Decodes `csi_plugin` with Nomad's defaults (`/csi`, `/local/csi`, 30 s).
fn csi_plugin(r: &Reader<'_>) -> DResult<CsiPluginConfig> {
    let mut c = CsiPluginConfig {
        mount_dir: "/csi".to_string(),
        stage_publish_base_dir: "/local/csi".to_string(),
        health_timeout: 30 * NS_PER_SEC,
        ..CsiPluginConfig::default()
    };
    r.set_string("id", &mut c.id)?;
    r.set_string("type", &mut c.plugin_type)?;
    r.set_string("mount_dir", &mut c.mount_dir)?;
    r.set_string("stage_publish_base_dir", &mut c.stage_publish_base_dir)?;
    r.set_duration("health_timeout", &mut c.health_timeout)?;
    r.finish()?;
    Ok(c)
}

/// Decodes `vault` into Nomad's JSON shape, with the defaults its parser
/// fills (`env = true`, `change_mode = "restart"`).
pub(crate) fn vault(r: &Reader<'_>) -> DResult<serde_json::Value> {
    let v = json!({
        "Policies": r.strings("policies")?.unwrap_or_default(),
        "Namespace": r.string("namespace")?.unwrap_or_default(),
        "Env": r.bool("env")?.unwrap_or(true),
        "DisableFile": r.bool("disable_file")?.unwrap_or_default(),
        "ChangeMode": r.string("change_mode")?.unwrap_or_else(|| "restart".to_string()),
        "ChangeSignal": r.string("change_signal")?.unwrap_or_default(),
    });
    r.finish()?;
    Ok(v)
}

/// Decodes a `scaling` block into Nomad's JSON shape (`ScalingPolicy`).
pub(crate) fn scaling_policy(r: &Reader<'_>, default_type: &str) -> DResult<serde_json::Value> {
    let min = r.int("min")?;
    let max = r.int("max")?;
    let enabled = r.bool("enabled")?.unwrap_or(true);
    let policy_type = r.string("type")?.unwrap_or_else(|| default_type.to_string());
    let policy = match r.free_form("policy")? {
        Some(p) => to_json_object(p),
        None => serde_json::Value::Null,
    };
    r.finish()?;
    Ok(json!({ "Type": policy_type, "Min": min, "Max": max, "Enabled": enabled, "Policy": policy }))
}

fn to_json_object(map: std::collections::BTreeMap<String, serde_json::Value>) -> serde_json::Value {
    serde_json::Value::Object(map.into_iter().collect())
}
