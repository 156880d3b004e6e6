//! A task's environment: the `NOMAD_*` variables Nomad gives every task, then the task's own
//! `env { }` block interpolated against them.
//!
//! Precedence, lowest first: the agent's own environment (raw_exec only, minus secrets such as
//! `VAULT_TOKEN`), the `NOMAD_*` variables, the task's `env`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use nomad_proto::resources::AllocatedPortMapping;
use nomad_proto::{Allocation, Node, Task};

use super::interpolate::Interpolator;

/// Agent environment variables never passed to tasks (Nomad's default `env.denylist`).
pub const ENV_DENYLIST: [&str; 8] = [
    "CONSUL_TOKEN",
    "CONSUL_HTTP_TOKEN",
    "VAULT_TOKEN",
    "NOMAD_LICENSE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS",
];

/// The task's directories as the task sees them (host paths for raw_exec, `/alloc`, `/local`,
/// `/secrets` inside a chroot or container).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDirs {
    /// `NOMAD_ALLOC_DIR`: the alloc's shared dir.
    pub alloc: PathBuf,
    /// `NOMAD_TASK_DIR`: the task's `local` dir.
    pub local: PathBuf,
    /// `NOMAD_SECRETS_DIR`.
    pub secrets: PathBuf,
}

impl TaskDirs {
    /// The directories inside an isolated file system.
    pub fn isolated() -> TaskDirs {
        TaskDirs { alloc: "/alloc".into(), local: "/local".into(), secrets: "/secrets".into() }
    }
}

/// What the environment is built from.
pub struct EnvInput<'a> {
    /// The alloc.
    pub alloc: &'a Allocation,
    /// The task.
    pub task: &'a Task,
    /// This node.
    pub node: &'a Node,
    /// Region.
    pub region: &'a str,
    /// The task's directories.
    pub dirs: &'a TaskDirs,
    /// The agent's environment, for drivers without isolation.
    pub host_env: Option<&'a BTreeMap<String, String>>,
}

/// Replaces characters not allowed in variable names with `_`, as Nomad does.
pub fn clean_env_key(key: &str) -> String {
    key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '.' { c } else { '_' }).collect()
}

/// The agent's environment minus [`ENV_DENYLIST`].
pub fn host_env() -> BTreeMap<String, String> {
    filter_env(std::env::vars())
}

fn filter_env(vars: impl Iterator<Item = (String, String)>) -> BTreeMap<String, String> {
    vars.filter(|(k, _)| !ENV_DENYLIST.contains(&k.as_str())).collect()
}

fn port_vars(env: &mut BTreeMap<String, String>, p: &AllocatedPortMapping) {
    let label = clean_env_key(&p.label);
    let host = p.value.to_string();
    let task_port = if p.to > 0 { p.to.to_string() } else { host.clone() };
    let host_addr = format!("{}:{host}", ip_for_addr(&p.host_ip));
    env.insert(format!("NOMAD_IP_{label}"), p.host_ip.clone());
    env.insert(format!("NOMAD_HOST_IP_{label}"), p.host_ip.clone());
    env.insert(format!("NOMAD_PORT_{label}"), task_port.clone());
    env.insert(format!("NOMAD_HOST_PORT_{label}"), host);
    env.insert(format!("NOMAD_ADDR_{label}"), host_addr.clone());
    env.insert(format!("NOMAD_HOST_ADDR_{label}"), host_addr);
    env.insert(format!("NOMAD_ALLOC_PORT_{label}"), task_port.clone());
    env.insert(format!("NOMAD_ALLOC_IP_{label}"), p.host_ip.clone());
    env.insert(format!("NOMAD_ALLOC_ADDR_{label}"), format!("{}:{task_port}", ip_for_addr(&p.host_ip)));
}

/// `NOMAD_UPSTREAM_{IP,PORT,ADDR}_<destination>` for every upstream of the group's Connect
/// sidecars (Nomad's `buildUpstreamsEnv`): the sidecar's local listener, always on 127.0.0.1
/// whatever `local_bind_address` says, under the destination's name as written and cleaned.
fn upstream_vars(env: &mut BTreeMap<String, String>, group: &nomad_proto::TaskGroup) {
    let upstreams =
        group.services.iter().filter_map(|s| s.connect.as_ref()?.sidecar_service.as_ref()?.proxy.as_ref()).flat_map(|p| p.upstreams.iter());
    for u in upstreams {
        let port = u.local_bind_port.to_string();
        for name in [u.destination_name.clone(), clean_env_key(&u.destination_name)] {
            env.insert(format!("NOMAD_UPSTREAM_IP_{name}"), "127.0.0.1".into());
            env.insert(format!("NOMAD_UPSTREAM_PORT_{name}"), port.clone());
            env.insert(format!("NOMAD_UPSTREAM_ADDR_{name}"), format!("127.0.0.1:{port}"));
        }
    }
}

/// IPv6 addresses are bracketed in `host:port` pairs.
fn ip_for_addr(ip: &str) -> String {
    if ip.contains(':') { format!("[{ip}]") } else { ip.to_string() }
}

/// Every port the alloc holds, as label/value/to/IP: the flat list when the scheduler filled it,
/// else the group and task networks.
pub fn ports(alloc: &Allocation, task: &str) -> Vec<AllocatedPortMapping> {
    let Some(res) = &alloc.allocated_resources else { return Vec::new() };
    if !res.shared.ports.is_empty() {
        return res.shared.ports.clone();
    }
    let task_networks = res.tasks.get(task).map(|t| t.networks.as_slice()).unwrap_or_default();
    res.shared
        .networks
        .iter()
        .chain(task_networks)
        .flat_map(|n| {
            n.reserved_ports.iter().chain(n.dynamic_ports.iter()).map(|p| AllocatedPortMapping {
                label: p.label.clone(),
                value: p.value,
                to: p.to,
                host_ip: n.ip.clone(),
            })
        })
        .collect()
}

/// Builds the task's complete environment.
pub fn build_env(input: &EnvInput<'_>) -> BTreeMap<String, String> {
    let EnvInput { alloc, task, node, region, dirs, host_env } = *input;
    let mut env: BTreeMap<String, String> = host_env.cloned().unwrap_or_default();
    let job = alloc.job.as_deref();
    let group = job.and_then(|j| j.lookup_task_group(&alloc.task_group));
    let mut set = |k: &str, v: String| {
        env.insert(k.to_string(), v);
    };
    set("NOMAD_ALLOC_DIR", dirs.alloc.display().to_string());
    set("NOMAD_TASK_DIR", dirs.local.display().to_string());
    set("NOMAD_SECRETS_DIR", dirs.secrets.display().to_string());
    set("NOMAD_ALLOC_ID", alloc.id.clone());
    set("NOMAD_SHORT_ALLOC_ID", alloc.id.chars().take(8).collect());
    set("NOMAD_ALLOC_NAME", alloc.name.clone());
    set("NOMAD_ALLOC_INDEX", alloc.index().to_string());
    set("NOMAD_GROUP_NAME", alloc.task_group.clone());
    set("NOMAD_TASK_NAME", task.name.clone());
    set("NOMAD_JOB_ID", alloc.job_id.clone());
    set("NOMAD_JOB_NAME", job.map(|j| if j.name.is_empty() { j.id.clone() } else { j.name.clone() }).unwrap_or_default());
    if let Some(parent) = job.map(|j| j.parent_id.clone()).filter(|p| !p.is_empty()) {
        set("NOMAD_JOB_PARENT_ID", parent);
    }
    set("NOMAD_NAMESPACE", if alloc.namespace.is_empty() { "default".into() } else { alloc.namespace.clone() });
    set("NOMAD_REGION", region.to_string());
    set("NOMAD_DC", node.datacenter.clone());

    // Limits: what the scheduler allocated, else what the task asked for.
    let allocated = alloc.allocated_resources.as_ref().and_then(|r| r.tasks.get(&task.name));
    let cpu = allocated.map(|a| a.cpu.cpu_shares).filter(|c| *c > 0).unwrap_or(task.resources.cpu);
    let memory = allocated.map(|a| a.memory.memory_mb).filter(|m| *m > 0).unwrap_or(task.resources.memory_mb);
    let memory_max = allocated.map(|a| a.memory.memory_max_mb).filter(|m| *m > 0).unwrap_or(task.resources.memory_max_mb);
    set("NOMAD_CPU_LIMIT", cpu.to_string());
    set("NOMAD_MEMORY_LIMIT", memory.to_string());
    if memory_max > 0 {
        set("NOMAD_MEMORY_MAX_LIMIT", memory_max.to_string());
    }
    let cores = allocated.map(|a| a.cpu.reserved_cores.clone()).unwrap_or_default();
    if !cores.is_empty() {
        set("NOMAD_CPU_CORES", cores.iter().map(u16::to_string).collect::<Vec<_>>().join(","));
    }

    // Meta: job, then group, then task; each key as written and upper-cased.
    let metas = [job.map(|j| &j.meta), group.map(|g| &g.meta), Some(&task.meta)];
    for meta in metas.into_iter().flatten() {
        for (k, v) in meta {
            let key = clean_env_key(k);
            set(&format!("NOMAD_META_{key}"), v.clone());
            set(&format!("NOMAD_META_{}", key.to_uppercase()), v.clone());
        }
    }
    for p in ports(alloc, &task.name) {
        port_vars(&mut env, &p);
    }
    if let Some(group) = group {
        upstream_vars(&mut env, group);
    }

    // The task's own variables, interpolated against everything above.
    let resolved: Vec<(String, String)> = {
        let interp = Interpolator { env: &env, node, region };
        task.env.iter().map(|(k, v)| (interp.replace(k), interp.replace(v))).collect()
    };
    env.extend(resolved);
    env
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use nomad_proto::resources::{AllocatedResources, AllocatedSharedResources, AllocatedTaskResources};
    use nomad_proto::{Job, TaskGroup};

    use super::*;

    pub(crate) fn fixture() -> (Allocation, Node) {
        let task = Task {
            name: "web".into(),
            meta: BTreeMap::from([("owner".to_string(), "task".to_string())]),
            env: BTreeMap::from([
                ("GREETING".to_string(), "hello ${NOMAD_ALLOC_INDEX} from ${node.datacenter}".to_string()),
                ("PORT".to_string(), "${NOMAD_PORT_http}".to_string()),
            ]),
            ..Task::default()
        };
        let job = Job {
            id: "example".into(),
            name: "Example".into(),
            meta: BTreeMap::from([("owner".to_string(), "job".to_string()), ("team".to_string(), "a".to_string())]),
            task_groups: vec![TaskGroup {
                name: "cache".into(),
                meta: BTreeMap::from([("tier".to_string(), "1".to_string())]),
                tasks: vec![task],
                ..TaskGroup::default()
            }],
            ..Job::default()
        };
        let mut tasks = BTreeMap::new();
        let mut web = AllocatedTaskResources::default();
        web.cpu.cpu_shares = 500;
        web.memory.memory_mb = 256;
        web.memory.memory_max_mb = 512;
        tasks.insert("web".to_string(), web);
        let alloc = Allocation {
            id: "0123456789abcdef".into(),
            name: "example.cache[2]".into(),
            namespace: "default".into(),
            job_id: "example".into(),
            task_group: "cache".into(),
            job: Some(Arc::new(job)),
            allocated_resources: Some(AllocatedResources {
                tasks,
                shared: AllocatedSharedResources {
                    ports: vec![AllocatedPortMapping { label: "http".into(), value: 25000, to: 8080, host_ip: "10.0.0.5".into() }],
                    ..AllocatedSharedResources::default()
                },
                ..AllocatedResources::default()
            }),
            ..Allocation::default()
        };
        let node = Node { id: "node-1".into(), name: "n1".into(), datacenter: "dc7".into(), ..Node::default() };
        (alloc, node)
    }

    #[test]
    fn nomad_variables_limits_meta_ports_and_interpolated_task_env() {
        let (alloc, node) = fixture();
        let task = alloc.job.as_ref().unwrap().task_groups[0].tasks[0].clone();
        let dirs = TaskDirs { alloc: "/a/alloc".into(), local: "/a/web/local".into(), secrets: "/a/web/secrets".into() };
        let host = BTreeMap::from([("PATH".to_string(), "/bin".to_string()), ("NOMAD_TASK_NAME".to_string(), "spoof".to_string())]);
        let env = build_env(&EnvInput { alloc: &alloc, task: &task, node: &node, region: "eu", dirs: &dirs, host_env: Some(&host) });
        let get = |k: &str| env.get(k).map(String::as_str).unwrap_or_else(|| panic!("{k} missing"));
        assert_eq!(get("NOMAD_ALLOC_ID"), "0123456789abcdef");
        assert_eq!(get("NOMAD_SHORT_ALLOC_ID"), "01234567");
        assert_eq!(get("NOMAD_ALLOC_NAME"), "example.cache[2]");
        assert_eq!(get("NOMAD_ALLOC_INDEX"), "2");
        assert_eq!(get("NOMAD_JOB_NAME"), "Example");
        assert_eq!(get("NOMAD_JOB_ID"), "example");
        assert_eq!(get("NOMAD_GROUP_NAME"), "cache");
        assert_eq!(get("NOMAD_TASK_NAME"), "web", "NOMAD_* beats the agent's environment");
        assert_eq!(get("NOMAD_NAMESPACE"), "default");
        assert_eq!(get("NOMAD_REGION"), "eu");
        assert_eq!(get("NOMAD_DC"), "dc7");
        assert_eq!(get("NOMAD_ALLOC_DIR"), "/a/alloc");
        assert_eq!(get("NOMAD_TASK_DIR"), "/a/web/local");
        assert_eq!(get("NOMAD_SECRETS_DIR"), "/a/web/secrets");
        assert_eq!(get("NOMAD_CPU_LIMIT"), "500");
        assert_eq!(get("NOMAD_MEMORY_LIMIT"), "256");
        assert_eq!(get("NOMAD_MEMORY_MAX_LIMIT"), "512");
        assert_eq!(get("NOMAD_META_owner"), "task", "task meta wins over group and job");
        assert_eq!(get("NOMAD_META_OWNER"), "task");
        assert_eq!(get("NOMAD_META_team"), "a");
        assert_eq!(get("NOMAD_META_TIER"), "1");
        assert_eq!(get("NOMAD_IP_http"), "10.0.0.5");
        assert_eq!(get("NOMAD_PORT_http"), "8080", "the mapped port is what the task binds");
        assert_eq!(get("NOMAD_HOST_PORT_http"), "25000");
        assert_eq!(get("NOMAD_ADDR_http"), "10.0.0.5:25000");
        assert_eq!(get("NOMAD_ALLOC_PORT_http"), "8080");
        assert_eq!(get("GREETING"), "hello 2 from dc7");
        assert_eq!(get("PORT"), "8080");
        assert_eq!(get("PATH"), "/bin");
    }

    /// Every task of a group with Connect upstreams learns where its sidecar listens for each
    /// (the countdash example's `${NOMAD_UPSTREAM_ADDR_count_api}`), under the raw and the
    /// cleaned name, always on 127.0.0.1.
    #[test]
    fn connect_upstreams_become_nomad_upstream_variables_usable_in_task_env() {
        use nomad_proto::service::{ConsulConnect, ConsulProxy, ConsulSidecarService, ConsulUpstream, Service};
        let (mut alloc, node) = fixture();
        let mut job = (**alloc.job.as_ref().unwrap()).clone();
        let upstream = |name: &str, port: i64, address: &str| ConsulUpstream {
            destination_name: name.into(),
            local_bind_port: port,
            local_bind_address: address.into(),
            ..ConsulUpstream::default()
        };
        job.task_groups[0].services = vec![Service {
            name: "count-dashboard".into(),
            connect: Some(ConsulConnect {
                sidecar_service: Some(ConsulSidecarService {
                    proxy: Some(ConsulProxy {
                        upstreams: vec![upstream("count-api", 8080, ""), upstream("db", 5432, "127.0.0.9")],
                        ..ConsulProxy::default()
                    }),
                    ..ConsulSidecarService::default()
                }),
                ..ConsulConnect::default()
            }),
            ..Service::default()
        }];
        job.task_groups[0].tasks[0].env.insert("API".into(), "http://${NOMAD_UPSTREAM_ADDR_count_api}".into());
        let task = job.task_groups[0].tasks[0].clone();
        alloc.job = Some(Arc::new(job));
        let dirs = TaskDirs::isolated();
        let env = build_env(&EnvInput { alloc: &alloc, task: &task, node: &node, region: "eu", dirs: &dirs, host_env: None });
        let get = |k: &str| env.get(k).map(String::as_str).unwrap_or_else(|| panic!("{k} missing"));
        assert_eq!(get("NOMAD_UPSTREAM_ADDR_count_api"), "127.0.0.1:8080");
        assert_eq!(get("NOMAD_UPSTREAM_ADDR_count-api"), "127.0.0.1:8080");
        assert_eq!(get("NOMAD_UPSTREAM_IP_count_api"), "127.0.0.1");
        assert_eq!(get("NOMAD_UPSTREAM_PORT_count_api"), "8080");
        assert_eq!(get("NOMAD_UPSTREAM_ADDR_db"), "127.0.0.1:5432", "Nomad ignores local_bind_address here");
        assert_eq!(get("API"), "http://127.0.0.1:8080");
    }

    #[test]
    fn the_denylist_keeps_agent_secrets_from_tasks() {
        let vars = [("VAULT_TOKEN", "s3cret"), ("HOME", "/root")].map(|(k, v)| (k.to_string(), v.to_string()));
        let env = filter_env(vars.into_iter());
        assert_eq!(env.keys().collect::<Vec<_>>(), ["HOME"]);
        assert_eq!(clean_env_key("my-port.x"), "my_port.x");
    }
}
